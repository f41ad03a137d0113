"""The :class:`georep.ports.RegionReceiver` on an azure-servicebus async receiver."""

from __future__ import annotations

__all__ = ["STUCK_AFTER", "ServiceBusRegionReceiver", "open_region_receiver"]

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import MessageLockLostError

from georep._endpoint import Target, check_entity_names
from georep.exceptions import ConfigurationError, GeoReplicationError, region_error
from georep.ports import Delivery, ErrorKind
from georep.receive.peek import peek_all
from georep.send.ordering import read_stamp

from ._region import SdkRegion, close_without_keep_alive_wait
from ._sender import entity_path_checked, open_client

_log = logging.getLogger("georep.adapters.servicebus")

STUCK_AFTER = 5.0
"""Seconds past its ``max_wait`` after which a receive the core gave up on counts as stuck
(its link presumed dead). Below georep's receive deadline (``max_wait`` + 10 s), above any
healthy receive (which returns at ``max_wait``)."""

_DISCARD_CLOSE_SECONDS = 5.0


_ENQUEUED_TIME = b"x-opt-enqueued-time"
"""The message annotation holding when the region stored the copy (ms since the epoch)."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class ServiceBusRegionReceiver(SdkRegion):
    """One region's peek-lock ``ServiceBusReceiver`` behind georep's port.

    A stuck receive. When the core gives up on a receive that ran :data:`STUCK_AFTER`
    seconds past its ``max_wait``, its link is presumed dead (an outage dropped it under
    the SDK). If georep created the receiver (``reopen`` given, as by
    :func:`open_region_receiver`), it discards that SDK receiver (closed in the background,
    bounded) and the next receive opens a fresh one, so the region is read again once it
    is back; copies received through the discarded one fail to settle with a lost lock
    and are redelivered. A caller's receiver is kept as it is (georep cannot replace it).

    Args:
        receiver: The SDK receiver, in PEEK_LOCK mode. Closed by :meth:`close` only if
            ``client`` is given (georep created both).
        region: The region's label.
        client: The client georep created for this receiver, closed with it.
        reopen: Creates a new SDK receiver for the same entity (on ``client``); given
            when georep created the receiver.

    Raises:
        ConfigurationError: The receiver is in RECEIVE_AND_DELETE mode (a copy would be
            gone before georep knew whether it was a duplicate or was processed).
    """

    def __init__(
        self,
        receiver: ServiceBusReceiver,
        *,
        region: str,
        client: ServiceBusClient | None = None,
        reopen: Callable[[], ServiceBusReceiver] | None = None,
    ) -> None:
        mode = getattr(receiver, "_receive_mode", ServiceBusReceiveMode.PEEK_LOCK)
        if mode != ServiceBusReceiveMode.PEEK_LOCK:
            raise ConfigurationError(
                f"the {region} receiver is in {mode} mode: GeoReceiver needs PEEK_LOCK "
                "(get_queue_receiver(..., receive_mode=ServiceBusReceiveMode.PEEK_LOCK))"
            )
        super().__init__(
            receiver,
            region=region,
            namespace=str(receiver.fully_qualified_namespace),
            entity=str(getattr(receiver, "_entity_path", None) or receiver.entity_path),
            client=client,
        )
        self._receiver = receiver
        self._link_open = False
        self._reopen = reopen
        self._closing: set[asyncio.Task[None]] = set()

    def _translate(self, exc: Exception) -> Exception:
        if isinstance(exc, MessageLockLostError):
            return region_error(
                f"{self._region} ({self._namespace}): the copy's lock was lost; it will be "
                "redelivered",
                region=self._region,
                kind=ErrorKind.LOCK_LOST,
            )
        return super()._translate(exc)

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        # The AMQP sections, read once: each of the SDK message's properties tests its
        # section's truth, which lists the section's fields every time (about a tenth of a
        # receiver's CPU per copy went there). The values are the ones the SDK properties
        # return: ``_text`` decodes bytes as they do.
        raw = message.raw_amqp_message
        fields = raw.properties
        header = raw.header
        annotations = raw.annotations or {}
        properties = raw.application_properties or {}
        if dedup_source == "message_id":
            key = _text(fields.message_id if fields is not None else None)
        elif dedup_source == "subject":
            key = _text(fields.subject if fields is not None else None)
        else:
            name = dedup_name or ""
            key = _text(properties.get(name.encode(), properties.get(name)))
        enqueued = annotations.get(_ENQUEUED_TIME)
        locked = self._locked_until(message)
        return Delivery(
            key=key,
            delivery_count=int((header.delivery_count if header is not None else 0) or 0) + 1,
            enqueued_at=enqueued / 1000.0 if enqueued else None,
            locked_until=locked.timestamp() if locked is not None else None,
            traceparent=_text(properties.get(b"traceparent", properties.get("traceparent"))),
            content_type=_text(fields.content_type if fields is not None else None),
            session_id=_text(fields.group_id if fields is not None else None),
            stamp=read_stamp(lambda name: properties.get(name.encode(), properties.get(name))),
        )

    def _locked_until(self, message: Any) -> Any:
        return message.locked_until_utc

    async def open(self) -> None:
        """Open the receiver's link now (the SDK's ``async with receiver`` does), so that
        the first receive does not wait for it. Idempotent.

        Raises:
            RegionError: The region refused or could not be reached.
        """
        if self._link_open:
            return
        await self._call(self._receiver.__aenter__)
        self._link_open = True

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        started = time.monotonic()
        try:
            # Open the link with the SDK's own open timeouts first: receive_messages
            # bounds the open by max_wait_time too, and a short idle wait on a busy
            # machine would then never get a link open at all.
            await self.open()
            return list(
                await self._receiver.receive_messages(
                    max_message_count=max_messages, max_wait_time=max_wait
                )
            )
        except asyncio.CancelledError:
            overran = time.monotonic() - started
            if self._reopen is not None and overran > max_wait + STUCK_AFTER:
                self._replace_receiver(overran)
            raise
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            self._link_open = False
            raise self._translate(exc) from exc

    def _replace_receiver(self, overran: float) -> None:
        """Discard the SDK receiver whose receive overran; the next receive opens anew."""
        assert self._reopen is not None
        old, self._receiver = self._receiver, close_without_keep_alive_wait(self._reopen())
        self._link_open = False
        closing = asyncio.ensure_future(self._close_discarded(old))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        _log.warning(
            "%s (%s): a receive did not return within %.0f s; its link is presumed dead: "
            "discarded the receiver and opening a new one (copies it held are redelivered)",
            self._region,
            self._namespace,
            overran,
        )

    async def _close_discarded(self, receiver: Any) -> None:
        try:
            async with asyncio.timeout(_DISCARD_CLOSE_SECONDS):
                await receiver.close()
        except Exception as exc:  # TimeoutError included: given up on, as intended
            _log.debug("closing a discarded %s receiver failed: %r", self._region, exc)

    def _receiver_of(self, message: Any) -> ServiceBusReceiver:
        """The receiver to settle ``message`` on: never another link than its own (a
        delivery id on a new link names another message)."""
        came_from = getattr(message, "_receiver", None)
        if self._reopen is not None and came_from is not None and came_from is not self._receiver:
            raise region_error(
                f"{self._region} ({self._namespace}): the copy's link was discarded; it "
                "will be redelivered",
                region=self._region,
                kind=ErrorKind.LOCK_LOST,
            )
        return self._receiver

    async def peek(self, count: int) -> list[Any]:
        return await self._call(lambda: peek_all(self._receiver, count))

    async def peek_from(self, count: int, from_sequence_number: int) -> list[Any]:
        """Up to ``count`` messages from this region's ``from_sequence_number`` on, not
        locked (the drop-in client's ``peek_messages``)."""
        return await self._call(
            lambda: peek_all(self._receiver, count, from_sequence_number=from_sequence_number)
        )

    async def receive_deferred(self, sequence_numbers: list[int]) -> list[Any]:
        """The deferred messages with these sequence numbers of this region, locked."""
        await self.open()
        return list(
            await self._call(lambda: self._receiver.receive_deferred_messages(sequence_numbers))
        )

    async def complete(self, message: ServiceBusReceivedMessage) -> None:
        await self._call(lambda: self._receiver_of(message).complete_message(message))

    async def complete_many(self, messages: list[ServiceBusReceivedMessage]) -> None:
        """Complete ``messages`` with one disposition per run of consecutive delivery ids,
        each run's outcome awaited: about 1 us of CPU per message, against about 160 for
        ``complete_message`` one at a time (one frame and one round trip each). The SDK
        has no public method for it; this uses its link as :meth:`release` does, and
        completes one at a time where that is not reachable.

        A run refused as a whole is completed one message at a time, so a failure is the
        one ``complete_message`` raises.

        Raises:
            RegionError: A message was not taken (those before it were; those after it
                were not tried).
        """
        if not messages:
            return
        receiver = self._receiver_of(messages[0])
        settle = getattr(getattr(receiver, "_handler", None), "settle_messages_async", None)
        runs = _delivery_runs(messages)
        if (
            settle is None
            or runs is None
            or any(self._receiver_of(m) is not receiver for m in messages)
        ):
            for message in messages:
                await self.complete(message)
            return

        link_settle: Callable[..., Awaitable[Any]] = settle

        async def accept(first: int, last: int, tag: bytes) -> None:
            await link_settle((first, last), tag, "accepted", await_outcome=True)

        for run in runs:
            first, last = run[0]._delivery_id, run[-1]._delivery_id
            try:
                await self._call(partial(accept, first, last, run[0]._delivery_tag))
            except Exception:
                # Refused as a range (say, the SDK reopened the link under the copies and
                # the ids name nothing on the new one): one at a time, each with the SDK's
                # own checks and errors (a lost lock is then LOCK_LOST).
                for message in run:
                    await self.complete(message)
                continue
            for message in run:
                message._settled = True

    async def abandon(self, message: ServiceBusReceivedMessage) -> None:
        await self._call(lambda: self._receiver_of(message).abandon_message(message))

    async def release(self, message: ServiceBusReceivedMessage) -> None:
        """Hand the copy back unseen: the AMQP ``released`` outcome on its link, which the
        broker does not count as a delivery. The SDK settles the messages that reach its
        buffer outside a receive call this way; it has no public method for it, so this
        uses its link as its own code does, and abandons where that is not reachable."""
        receiver = self._receiver_of(message)
        settle = getattr(getattr(receiver, "_handler", None), "settle_messages_async", None)
        delivery_id = getattr(message, "_delivery_id", None)
        delivery_tag = getattr(message, "_delivery_tag", None)
        if settle is None or delivery_id is None or delivery_tag is None:
            await self.abandon(message)
            return
        await self._call(lambda: settle(delivery_id, delivery_tag, "released"))

    async def dead_letter(
        self, message: ServiceBusReceivedMessage, reason: str | None, description: str | None
    ) -> None:
        await self._call(
            lambda: self._receiver_of(message).dead_letter_message(
                message, reason=reason, error_description=description
            )
        )

    async def defer(self, message: ServiceBusReceivedMessage) -> None:
        await self._call(lambda: self._receiver_of(message).defer_message(message))

    async def renew_lock(self, message: ServiceBusReceivedMessage) -> float | None:
        try:
            expiry = await self._receiver_of(message).renew_message_lock(message)
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            raise self._translate(exc) from exc
        return expiry.timestamp() if expiry is not None else None

    async def close(self) -> None:
        # Not SdkRegion.close: the receiver may have been replaced, and discarded ones may
        # still be closing.
        if self._client is None:
            return
        try:
            await self._receiver.close()
            if self._closing:
                # Each gives up at its own timeout, unless the SDK swallows that
                # cancellation: so the wait here is bounded too.
                _, stuck = await asyncio.wait(set(self._closing), timeout=_DISCARD_CLOSE_SECONDS)
                if stuck:
                    _log.warning(
                        "%s (%s): %d discarded receiver(s) still closing after %.0f s; "
                        "left to finish on their own",
                        self._region,
                        self._namespace,
                        len(stuck),
                        _DISCARD_CLOSE_SECONDS,
                    )
        finally:
            await self._client.close()


def open_region_receiver(
    connection_string: Target,
    *,
    region: str,
    queue_name: str | None = None,
    topic_name: str | None = None,
    subscription_name: str | None = None,
    prefetch_count: int = 0,
    sub_queue: Any = None,
    retry_total: int = 1,
    retry_backoff_factor: float = 0.01,
    **client_kwargs: Any,
) -> ServiceBusRegionReceiver:
    """Create a client and a peek-lock receiver for one region, owned by the result.

    ``sub_queue`` (``ServiceBusSubQueue.DEAD_LETTER``...) reads that sub-queue of the entity.

    Raises:
        ConfigurationError: The connection string is malformed (the message never shows it).
    """
    check_entity_names(
        queue_name=queue_name, topic_name=topic_name, subscription_name=subscription_name
    )
    client = open_client(
        connection_string,
        region=region,
        retry_total=retry_total,
        retry_backoff_factor=retry_backoff_factor,
        **client_kwargs,
    )

    def new_receiver() -> ServiceBusReceiver:
        if queue_name is not None:
            return client.get_queue_receiver(
                queue_name,
                receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                prefetch_count=prefetch_count,
                sub_queue=sub_queue,
            )
        return client.get_subscription_receiver(
            str(topic_name),
            str(subscription_name),
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=prefetch_count,
            sub_queue=sub_queue,
        )

    with entity_path_checked(region):
        first = new_receiver()
    return ServiceBusRegionReceiver(first, region=region, client=client, reopen=new_receiver)


def _delivery_runs(messages: list[Any]) -> list[list[Any]] | None:
    """``messages`` in runs of consecutive delivery ids (one disposition each), in id
    order; None when a message lacks its SDK delivery id or tag."""
    known: list[tuple[int, Any]] = []
    for message in messages:
        delivery_id = getattr(message, "_delivery_id", None)
        if not isinstance(delivery_id, int) or getattr(message, "_delivery_tag", None) is None:
            return None
        known.append((delivery_id, message))
    known.sort(key=lambda pair: pair[0])
    runs: list[list[Any]] = []
    previous = None
    for delivery_id, message in known:
        if previous is None or delivery_id != previous + 1:
            runs.append([])
        runs[-1].append(message)
        previous = delivery_id
    return runs
