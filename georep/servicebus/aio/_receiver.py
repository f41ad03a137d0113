"""The drop-in async ``ServiceBusReceiver``: the SDK's receiver methods over a PullReceiver."""

from __future__ import annotations

__all__ = ["DEFAULT_RECEIVE_WAIT", "ServiceBusReceiver"]

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Self

from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode

from georep._lifecycle import ClosedOnAsyncExit
from georep.exceptions import ClosedError, ConfigurationError, InvalidMessageError
from georep.receive.context import ReceiverStats
from georep.receive.outcomes import (
    ABANDON,
    COMPLETE,
    TWIN_DESCRIPTION,
    TWIN_REASON_PREFIX,
    Decision,
    Settle,
    dead_letter_decision as _dead_letter_decision,
)
from georep.receive.pull import Handout, PullReceiver
from georep.send.schedule import sequence_number

from ._deferred import DeferredBook, DeferredMessages
from ._numbers import mark
from ._peek import MergedPeek

if TYPE_CHECKING:
    from ._session import GeoSession

Opener = Callable[["ServiceBusReceiver"], Awaitable[tuple[PullReceiver, "GeoSession"]]]
"""Opens a session receiver: locks its session in the regions and builds what pulls it."""

DEFAULT_RECEIVE_WAIT: Final = 60.0
"""Seconds ``receive_messages`` waits without ``max_wait_time`` on it or the receiver (the
SDK's default)."""

_REASON: Final = b"DeadLetterReason"
_DESCRIPTION: Final = b"DeadLetterErrorDescription"


class ServiceBusReceiver(ClosedOnAsyncExit):
    """Receives from a queue or subscription in two regions, with
    ``azure.servicebus.aio.ServiceBusReceiver``'s methods, arguments and results.

    Made by :meth:`georep.servicebus.aio.ServiceBusClient.get_queue_receiver` (or
    ``get_subscription_receiver``). Each logical message is handed out once across both
    regions and every process sharing the seen-set; settling it settles its copy in the
    other region too. The messages are the SDK's ``ServiceBusReceivedMessage`` objects of
    the region they came from; their ``sequence_number`` is that region's, with bit 62 set
    for the secondary's (:mod:`georep.servicebus.aio._numbers`), so each number names one
    message and ``receive_deferred_messages`` finds it from any process. Their locks are
    renewed by georep until they are settled (an ``AutoLockRenewer`` is not needed, and
    works).
    """

    def __init__(
        self,
        pull: PullReceiver | None,
        *,
        fully_qualified_namespace: str,
        entity_path: str,
        receive_mode: ServiceBusReceiveMode,
        max_wait_time: float | None,
        prefetch_count: int,
        auto_lock_renewer: Any = None,
        dead_letter: bool = False,
        opener: Opener | None = None,
        deferred: DeferredBook | None = None,
        client_identifier: str = "",
    ) -> None:
        self._pull = pull
        self._book = deferred or DeferredBook()
        self._deferred = None if pull is None else DeferredMessages(pull, self._book)
        self._opener = opener
        self._open_lock = asyncio.Lock()
        self._session: GeoSession | None = None
        self._closed = False
        self.fully_qualified_namespace = fully_qualified_namespace
        self.entity_path = entity_path
        self.client_identifier = client_identifier
        self._receive_mode = receive_mode
        self._max_wait_time = max_wait_time
        self._prefetch_count = prefetch_count
        self._auto_lock_renewer = auto_lock_renewer
        self._dead_letter = dead_letter
        self._peek = None if pull is None else MergedPeek(pull)

    @property
    def session(self) -> GeoSession | None:
        """The session this receiver holds (in both regions), once it is open; None for a
        sessionless receiver (as the SDK's)."""
        return self._session

    @property
    def stats(self) -> ReceiverStats:
        """georep's counters of this receiver (per region: received, suppressed...)."""
        return ReceiverStats() if self._pull is None else self._pull.geo.stats

    @property
    def _running(self) -> bool:
        # Read by the SDK's AutoLockRenewer on a session's receiver.
        return not self._closed

    async def _opened(self) -> PullReceiver:
        """The pull receiver; a session receiver locks its session on first use.

        Raises:
            ClosedError: The receiver was closed.
        """
        if self._closed:
            raise ClosedError("this ServiceBusReceiver is closed; create a new one")
        if self._pull is None:
            async with self._open_lock:
                if self._pull is None:
                    assert self._opener is not None
                    pull, self._session = await self._opener(self)
                    self._peek = MergedPeek(pull)
                    self._deferred = DeferredMessages(pull, self._book)
                    self._pull = pull
                    if self._auto_lock_renewer is not None:  # as the SDK: it renews the session
                        self._auto_lock_renewer.register(self, self._session)
        return self._pull

    @property
    def receive_mode(self) -> ServiceBusReceiveMode:
        return self._receive_mode

    # ------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        """Open the receiver: its links in both regions, as the SDK's opens its one (a
        region that is down does not hold it up: see :meth:`PullReceiver.open`).

        Raises:
            EntityNotFoundError, AuthenticationError: Every region refused the receiver's
                entity or key (the SDK's ``MessagingEntityNotFoundError``,
                ``ServiceBusAuthenticationError``); the receiver is closed.
        """
        try:
            await (await self._opened()).open()
        except BaseException:
            await self.close()  # as the SDK's handler, closed when it could not open
            raise
        return self

    async def close(self) -> None:
        """Stop receiving; messages handed out and not settled are abandoned (a session
        receiver releases its session). Idempotent."""
        self._closed = True
        async with self._open_lock:
            if self._session is not None:
                await self._session.stop_keeping()
            if self._pull is not None:
                await self._pull.aclose()

    # ------------------------------------------------------------------- receiving

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ServiceBusReceivedMessage:
        """The next message; the iteration ends after ``max_wait_time`` (the receiver's)
        without one, or never when it is None."""
        messages = await self._receive(1, self._max_wait_time)
        if not messages:
            raise StopAsyncIteration
        return messages[0]

    async def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """Up to ``max_message_count`` messages from either region, as the SDK's method.

        Waits up to ``max_wait_time`` seconds (default: the receiver's, else 60) for the
        first; returns once no more arrived within 0.2 s of the last.

        Raises:
            ConfigurationError: ``max_message_count`` below 1 or ``max_wait_time`` not
                above 0 (a ``ValueError``, as the SDK raises).
            ClosedError: The receiver was closed.
        """
        if max_wait_time is not None and max_wait_time <= 0:
            raise ConfigurationError("max_wait_time must be greater than 0")
        if max_message_count is None:
            if not self._prefetch_count:
                return []
            max_message_count = self._prefetch_count
        if max_message_count < 1:
            raise ConfigurationError("max_message_count must be greater than 0")
        if max_wait_time is None:
            max_wait_time = self._max_wait_time or DEFAULT_RECEIVE_WAIT
        return await self._receive(max_message_count, max_wait_time)

    async def _receive(self, count: int, wait: float | None) -> list[ServiceBusReceivedMessage]:
        handouts = await (await self._opened()).receive(count, wait)
        return [self._hand_out(handout) for handout in handouts]

    def _hand_out(self, handout: Handout) -> ServiceBusReceivedMessage:
        if self._peek is not None:
            self._peek.received(handout.region, handout.message.sequence_number)
        message: ServiceBusReceivedMessage = mark(handout.message, handout.region)
        if self._dead_letter:
            _show_original_reason(message)
        if (
            self._auto_lock_renewer is not None
            and self._session is None
            and self._receive_mode is ServiceBusReceiveMode.PEEK_LOCK
        ):
            self._auto_lock_renewer.register(self, message)
        return message

    async def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """Browse both regions: up to ``max_message_count`` messages, one copy of each.

        Without a ``sequence_number``, a call continues where the previous one ended, or
        after the last message received from that region (as the SDK's); a
        ``sequence_number`` that continues the previous page keeps that walk, any other
        starts both regions at it. Not locked, not settleable.

        Raises:
            AuthenticationError, EntityNotFoundError: Every region refused so (the SDK's
                ``ServiceBusAuthenticationError``, ``MessagingEntityNotFoundError``).
            AllRegionsUnavailableError: No region answered.
            ConfigurationError: ``max_message_count`` is negative (a ``ValueError``).
        """
        if timeout is not None and timeout <= 0:
            raise ConfigurationError("timeout must be greater than 0")
        if int(max_message_count) < 0:
            raise ConfigurationError("max_message_count must be 1 or greater")
        if max_message_count == 0:
            return []
        (await self._opened())._check_open()
        assert self._peek is not None
        messages = await self._peek.peek(max_message_count, sequence_number, timeout)
        if self._dead_letter:
            for message in messages:
                _show_original_reason(message)
        return messages

    async def receive_deferred_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """The deferred messages with these numbers (the ``sequence_number`` of the messages
        as this client handed them out), each from the region it was deferred in.

        Settle them on this receiver; completing or dead-lettering one settles its
        deferred twin in the other region too. In RECEIVE_AND_DELETE mode they are
        completed as they are returned. Numbers this client did not hand out are looked
        for in the primary, then the secondary.

        Raises:
            RegionError: A region refused (no such deferred message) or did not answer.
            InvalidMessageError: A number is not an int (nothing was received).
        """
        if timeout is not None and timeout <= 0:
            raise ConfigurationError("timeout must be greater than 0")
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else sequence_numbers
        numbers = [sequence_number(number) for number in numbers]
        if not numbers:
            return []
        await self._opened()
        assert self._deferred is not None
        messages = await self._deferred.receive(numbers, timeout)
        if self._receive_mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            for message in messages:
                await self._deferred.settle(message, COMPLETE, "receive_deferred_messages")
            return messages
        if self._auto_lock_renewer is not None and self._session is None:
            for message in messages:
                self._auto_lock_renewer.register(self, message)
        return messages

    # ------------------------------------------------------------------- settling

    async def _settle(
        self,
        message: ServiceBusReceivedMessage,
        decision: Decision,
        operation: str,
        *,
        applied: bool = False,
    ) -> Handout | None:
        """Settle a message this receiver handed out (or a deferred one it returned)."""
        _check_message(message, operation)
        pull = await self._opened()
        if self._deferred is not None and self._deferred.holds(message):
            if self._receive_mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE:
                raise ConfigurationError(f"{operation}: not supported in RECEIVE_AND_DELETE mode")
            await self._deferred.settle(message, decision, operation)
            return None
        return await pull.settle(message, decision, operation, applied=applied)

    async def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        """Complete the message, and its copy in the other region.

        Raises:
            SettlementError: Not a message this receiver handed out, or settled already.
            ConfigurationError: RECEIVE_AND_DELETE mode.
        """
        await self._settle(message, COMPLETE, "complete_message")

    async def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        """Abandon the message: it is handed out again (from either region).

        Raises:
            SettlementError, ConfigurationError: As :meth:`complete_message`.
        """
        await self._settle(message, ABANDON, "abandon_message")

    async def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        """Defer the message, and its copy in the other region. Returns once its region
        deferred it (or failed to: then the copy is deferred when it is delivered again,
        and ``receive_deferred_messages`` finds the twin georep deferred in the other
        region).

        Raises:
            SettlementError, ConfigurationError: As :meth:`complete_message`.
        """
        # As the SDK's, it returns once the region deferred it (or could not): the next
        # call may be receive_deferred_messages with its number.
        handout = await self._settle(message, Decision(Settle.DEFER), "defer_message", applied=True)
        if handout is not None and message.sequence_number is not None:
            await self._book.deferred(int(message.sequence_number), handout.key)

    async def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        """Dead-letter the message; its copy in the other region is dead-lettered too
        (reason ``georep:twin:`` + ``reason``).

        Raises:
            SettlementError, ConfigurationError: As :meth:`complete_message`.
        """
        decision = _dead_letter_decision(reason, error_description)
        await self._settle(message, decision, "dead_letter_message")

    async def renew_message_lock(
        self, message: ServiceBusReceivedMessage, *, timeout: float | None = None
    ) -> datetime:
        """Renew the message's lock in its region; its new expiry (UTC).

        Raises:
            SettlementError: Not a message this receiver holds.
            RegionError: The region refused (the lock was lost) or did not answer.
        """
        if self._opener is not None:
            raise TypeError(
                "Renewing message lock is an invalid operation when working with sessions. "
                "Please renew the session lock instead."
            )
        _check_message(message, "renew_message_lock")
        pull = await self._opened()
        if self._deferred is not None and self._deferred.holds(message):
            expiry = await self._deferred.renew_lock(message)
        else:
            expiry = await pull.renew_lock(message)
        locked_until = message.locked_until_utc
        if locked_until is not None:
            return locked_until
        return datetime.fromtimestamp(expiry or 0.0, UTC)


def _show_original_reason(message: ServiceBusReceivedMessage) -> None:
    """A dead-lettered copy that is the twin of one dead-lettered in the other region shows
    the original's reason and description, as the SDK would show the original: georep
    dead-lettered it with ``georep:twin:`` + that reason, and the original's description
    (or, when it had none, one of georep's that says why)."""
    properties = message.application_properties
    reason = message.dead_letter_reason
    if properties is None or not reason or not reason.startswith(TWIN_REASON_PREFIX):
        return
    original = reason.removeprefix(TWIN_REASON_PREFIX)
    if original:
        properties[_REASON] = original.encode()
    else:  # the original was dead-lettered without a reason
        properties.pop(_REASON, None)
    description = message.dead_letter_error_description
    if description is not None and description.startswith(TWIN_DESCRIPTION):
        properties.pop(_DESCRIPTION, None)
    if not properties:  # the original had none at all: the SDK shows None, not {}
        message.raw_amqp_message.application_properties = None


def _check_message(message: object, operation: str) -> None:
    """Raises InvalidMessageError (a ``TypeError``, as the SDK's): not a received message."""
    if not isinstance(message, ServiceBusReceivedMessage):
        raise InvalidMessageError(
            f"{operation}: the message must be a ServiceBusReceivedMessage this receiver "
            f"handed out, got {type(message).__name__}"
        )
