"""The blocking drop-in client: ``azure.servicebus``'s sync API over the async one.

There is no second implementation: every object here drives its :mod:`georep.servicebus.aio`
counterpart on georep's one event-loop thread (:data:`georep._sync_runtime.RUNTIME`, as
:mod:`georep.sync` does), so sync and async clients behave alike. The async resources a
sync caller passes (``seen``, ``outbox``, ``ledger``, ``role_store``) live on that loop and
are closed when the last sync object using them lets go (a sync caller cannot await their
``aclose``): a :class:`ServiceBusClient` once it is garbage-collected or at exit (its
``close`` leaves it usable, as the SDK's), with every sender and receiver it made.
"""

from __future__ import annotations

__all__ = ["ServiceBusClient", "ServiceBusReceiver", "ServiceBusSender", "ServiceBusSession"]

import logging
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import Any, Generic, Self, TypeVar, Unpack, cast

from azure.core.async_paging import AsyncItemPaged
from azure.core.paging import ItemPaged
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusSession as _SdkSession

from georep import _fork
from georep._endpoint import Target
from georep._lifecycle import ClosedOnExit
from georep._sync_runtime import RESOURCE_OPTIONS, RUNTIME, LoopUser, built
from georep.exceptions import ClosedError
from georep.receive.context import ReceiverStats
from georep.send.sender import GeoSender, SendResult

from . import aio
from ._options import (
    ClientConstructors,
    ClientOptions,
    ReceiverArguments,
    SenderArguments,
    SessionListArguments,
)
from .aio._session import GeoSession

_log = logging.getLogger("georep.servicebus")
_T = TypeVar("_T")
_Core = TypeVar("_Core", aio.ServiceBusSender, aio.ServiceBusReceiver)


def _call(coroutine: Coroutine[Any, Any, _T]) -> _T:
    return RUNTIME.call(coroutine)


def _blocking(paged: AsyncItemPaged[str]) -> ItemPaged[str]:
    """``paged`` read on georep's loop thread when first iterated, as one page."""

    async def read() -> list[str]:
        return [item async for item in paged]

    return ItemPaged(lambda _token: _call(read()), lambda items: (None, items))


class ServiceBusClient(ClientConstructors, ClosedOnExit):
    """``azure.servicebus.ServiceBusClient`` over two regions (blocking); as
    :class:`georep.servicebus.aio.ServiceBusClient`, built the same way."""

    def __init__(self, primary: Target, secondary: Target, **options: Unpack[ClientOptions]):
        self._targets = (primary, secondary)
        self._given: ClientOptions = cast(ClientOptions, dict(options))
        self._without_seen = False
        self._parent = 0
        self._build(self._given)

    def _build(self, options: ClientOptions) -> None:
        use = self._use = LoopUser(options)
        primary, secondary = self._targets
        self._core = core = use.build(lambda: aio.ServiceBusClient(primary, secondary, **options))
        self._made_after_forks, self._made_in = _fork.fork_count(), os.getpid()
        # The loop and the resources it was given are let go with the client object (or at
        # the interpreter's exit): close() leaves it usable, as the SDK's blocking client.
        self._release = weakref.finalize(self, _release, use, core, _fork.fork_count())

    def _after_fork(self) -> None:
        """In a process forked after the client was made (gunicorn ``--preload``, Celery
        prefork, multiprocessing's ``fork``): build the child's own core (loop thread,
        connections), as the SDK's client opens its connections in the child. The async
        resources it was given are the parent's: with an outbox, a ledger or a role
        store it raises ForkedProcessError; the seen-set is replaced by one of the child's
        own with the same settings (``RedisSeenSet.for_forked_child``), or, for one that
        cannot make one (given its Redis client), left behind: the child's client then
        sends (and lists sessions) but its receivers raise ForkedProcessError."""
        with _fork.reopen_lock():
            if self._made_after_forks == _fork.fork_count():
                return  # another thread of the child rebuilt it
            kept = {k: v for k, v in self._given.items() if k not in RESOURCE_OPTIONS}
            parents = sorted(set(self._given) & set(RESOURCE_OPTIONS) - {"seen"})
            if parents:
                raise _fork.forked_error(
                    f"this ServiceBusClient (its {', '.join(parents)})", self._made_in
                )
            _fork.abandon(self._core)
            parent = self._parent = self._made_in
            seen = self._given.get("seen")
            if seen is not None:  # a RedisSeenSet of the child's own, if it can make one
                child_seen = getattr(seen, "for_forked_child", lambda: None)()
                if child_seen is not None:
                    kept["seen"] = child_seen
            self._without_seen = seen is not None and "seen" not in kept
            self._build(cast(ClientOptions, kept))
        _log.info(
            "a ServiceBusClient created in process %d before a fork: reopened in process %d "
            "with its own connections%s",
            parent,
            self._made_in,
            " (its seen-set was given its Redis client: receivers made here raise)"
            if self._without_seen
            else "",
        )

    @property
    def fully_qualified_namespace(self) -> str:
        """The primary region's namespace."""
        return self._core.fully_qualified_namespace

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def close(self) -> None:
        """Close every sender and receiver this client made (using one afterwards raises
        the SDK's ``ValueError``). As the SDK's blocking client, this one can be used
        again: a new ``with client:`` or ``get_queue_sender`` works. The ``seen``,
        ``outbox``, ``ledger`` and ``role_store`` it was given stay open while the client
        object lives: they are closed (those no other ``georep.sync`` object uses) once it
        is garbage-collected, or at the interpreter's exit. Idempotent. In a forked child
        that has not used it, there is nothing of this process's to close."""
        if self._made_after_forks != _fork.fork_count():
            return
        if not self._use.closed:
            _call(self._core.close())

    def get_queue_sender(
        self, queue_name: str, **arguments: Unpack[SenderArguments]
    ) -> ServiceBusSender:
        """As :meth:`georep.servicebus.aio.ServiceBusClient.get_queue_sender`."""
        self._check_open()
        return self._sender(partial(self._core.get_queue_sender, queue_name, **arguments))

    def get_topic_sender(
        self, topic_name: str, **arguments: Unpack[SenderArguments]
    ) -> ServiceBusSender:
        """As :meth:`georep.servicebus.aio.ServiceBusClient.get_topic_sender`."""
        self._check_open()
        return self._sender(partial(self._core.get_topic_sender, topic_name, **arguments))

    def _sender(self, get: Callable[[], aio.ServiceBusSender]) -> ServiceBusSender:
        self._check_open()
        sender = ServiceBusSender(_call(built(get)))
        sender._client = self  # the client's resources live as long as what it made
        return sender

    def _check_open(self) -> None:
        """Raises ClosedError: the interpreter is exiting (the client's resources closed).
        In a forked child, builds the child's own core first (:meth:`_after_fork`)."""
        if self._made_after_forks != _fork.fork_count():
            self._after_fork()
        if self._use.closed:
            raise ClosedError("this ServiceBusClient's resources were closed at exit")

    def get_queue_receiver(
        self, queue_name: str, **arguments: Unpack[ReceiverArguments]
    ) -> ServiceBusReceiver:
        """As the async client's
        :meth:`~georep.servicebus.aio.ServiceBusClient.get_queue_receiver`."""
        self._check_open()
        return self._receiver(partial(self._core.get_queue_receiver, queue_name), arguments)

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **arguments: Unpack[ReceiverArguments]
    ) -> ServiceBusReceiver:
        """As the async client's
        :meth:`~georep.servicebus.aio.ServiceBusClient.get_subscription_receiver`."""
        self._check_open()
        get = partial(self._core.get_subscription_receiver, topic_name, subscription_name)
        return self._receiver(get, arguments)

    def list_queue_sessions(
        self, queue_name: str, **arguments: Unpack[SessionListArguments]
    ) -> ItemPaged[str]:
        """As the async client's
        :meth:`~georep.servicebus.aio.ServiceBusClient.list_queue_sessions`."""
        self._check_open()
        return _blocking(self._core.list_queue_sessions(queue_name, **arguments))

    def list_subscription_sessions(
        self, topic_name: str, subscription_name: str, **arguments: Unpack[SessionListArguments]
    ) -> ItemPaged[str]:
        """As the async client's
        :meth:`~georep.servicebus.aio.ServiceBusClient.list_subscription_sessions`."""
        self._check_open()
        paged = self._core.list_subscription_sessions(topic_name, subscription_name, **arguments)
        return _blocking(paged)

    def _receiver(
        self, get: Callable[..., aio.ServiceBusReceiver], arguments: ReceiverArguments
    ) -> ServiceBusReceiver:
        # The sync AutoLockRenewer stays on this side: it calls this blocking receiver.
        self._check_open()
        if self._without_seen:
            raise _fork.forked_error(
                "this ServiceBusClient's seen-set (needed to receive)", self._parent
            )
        core_arguments = {k: v for k, v in arguments.items() if k != "auto_lock_renewer"}
        core = _call(built(lambda: get(**core_arguments)))
        receiver = ServiceBusReceiver(core, arguments.get("auto_lock_renewer"))
        receiver._client = self  # the client's resources live as long as what it made
        return receiver


def _release(use: LoopUser, core: aio.ServiceBusClient, forks: int) -> None:
    """Let go of a blocking client's loop and resources (its garbage collection or the
    interpreter's exit). In a forked child they are the parent's: left alone."""
    if forks != _fork.fork_count():
        return
    if threading.current_thread() is RUNTIME.thread:  # collected on the loop: not from here
        threading.Thread(target=_release, args=(use, core, forks), daemon=True).start()
        return
    try:
        use.close(core._shutdown)
    except Exception as error:  # at exit or in the collector there is no caller to tell
        _log.warning("closing a ServiceBusClient's resources failed: %s", type(error).__name__)


class _MadeHere:
    """Runs its async core's calls on georep's loop, in the process it was made in: in a
    process forked after that, it raises ForkedProcessError (its connections and the loop
    thread it ran on are the parent's)."""

    _made_after_forks = 0
    _made_in = 0
    _kind = "object"

    def _mark(self) -> None:
        self._made_after_forks, self._made_in = _fork.fork_count(), os.getpid()

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if self._made_after_forks != _fork.fork_count():
            coroutine.close()
            raise _fork.forked_error(f"this {self._kind}", self._made_in)
        return _call(coroutine)


class _OverCore(_MadeHere, ClosedOnExit, Generic[_Core]):
    """A blocking sender or receiver over its async one (``_core``): entering opens it and
    closing closes it, on georep's loop."""

    _core: _Core
    _client: ServiceBusClient | None = None
    """The client that made it: kept alive (its resources open) while this is used."""

    def __enter__(self) -> Self:
        self._run(self._core.__aenter__())
        return self

    def close(self) -> None:
        """Close it (idempotent); a receiver abandons the messages it handed out that were
        not settled. In a process forked after it was made, only marks it closed (closing
        would close the parent's connections)."""
        if self._made_after_forks != _fork.fork_count():
            _fork.abandon(self._core)
            return
        self._run(self._core.close())


class ServiceBusSender(_OverCore[aio.ServiceBusSender]):
    """``azure.servicebus.ServiceBusSender`` over two regions (blocking); as
    :class:`georep.servicebus.aio.ServiceBusSender`."""

    _kind = "ServiceBusSender"

    def __init__(self, core: aio.ServiceBusSender) -> None:
        self._mark()
        self._core = core
        self.entity_name = core.entity_name
        self.fully_qualified_namespace = core.fully_qualified_namespace
        self.client_identifier = core.client_identifier

    @property
    def last_result(self) -> SendResult | None:
        """What the last ``send_messages`` did in each region."""
        return self._core.last_result

    @property
    def geo_sender(self) -> GeoSender:
        """The :class:`georep.GeoSender` underneath (async: use it on georep's loop only)."""
        return self._core.geo_sender

    def send_messages(self, message: Any, *, timeout: float | None = None) -> None:
        """As :meth:`georep.servicebus.aio.ServiceBusSender.send_messages`."""
        self._run(self._core.send_messages(message, timeout=timeout))

    def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None
    ) -> list[int]:
        """As :meth:`georep.servicebus.aio.ServiceBusSender.schedule_messages`."""
        return self._run(self._core.schedule_messages(messages, schedule_time_utc, timeout=timeout))

    def cancel_scheduled_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None
    ) -> None:
        """As :meth:`georep.servicebus.aio.ServiceBusSender.cancel_scheduled_messages`."""
        self._run(self._core.cancel_scheduled_messages(sequence_numbers, timeout=timeout))

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> Any:
        """As :meth:`georep.servicebus.aio.ServiceBusSender.create_message_batch`."""
        return self._run(self._core.create_message_batch(max_size_in_bytes))


class ServiceBusSession(_MadeHere, _SdkSession):
    """``receiver.session`` of a blocking session receiver (an ``azure.servicebus``
    ``ServiceBusSession``, so the SDK's ``AutoLockRenewer`` takes it); as
    :class:`georep.servicebus.aio._session.GeoSession`."""

    _kind = "ServiceBusSession"

    def __init__(self, core: GeoSession, receiver: ServiceBusReceiver) -> None:
        _SdkSession.__init__(self, core.session_id, receiver)  # type: ignore[arg-type]
        self._mark()
        self._core = core
        self._session_start = core._session_start  # read by the SDK's AutoLockRenewer

    @property
    def locked_until_utc(self) -> datetime | None:
        return self._core.locked_until_utc

    @property
    def _lock_expired(self) -> bool:
        return bool(self._core._lock_expired)

    def get_state(self, *, timeout: float | None = None, **kwargs: Any) -> bytes:
        """The session's state (None if none was set), the same from either region."""
        return self._run(self._core.get_state(timeout=timeout))

    def set_state(
        self, state: str | bytes | bytearray | None, *, timeout: float | None = None, **kwargs: Any
    ) -> None:
        """Set (None: clear) the session's state, for both regions."""
        self._run(self._core.set_state(state, timeout=timeout))

    def renew_lock(self, *, timeout: float | None = None, **kwargs: Any) -> datetime:
        """Renew the session's lock in both regions; the earliest expiry."""
        return self._run(self._core.renew_lock(timeout=timeout))


class ServiceBusReceiver(_OverCore[aio.ServiceBusReceiver]):
    """``azure.servicebus.ServiceBusReceiver`` over two regions (blocking); as
    :class:`georep.servicebus.aio.ServiceBusReceiver`.

    An ``auto_lock_renewer`` (the SDK's sync ``AutoLockRenewer``) is given each message
    with this receiver, as the SDK's receiver does.
    """

    _kind = "ServiceBusReceiver"

    def __init__(self, core: aio.ServiceBusReceiver, auto_lock_renewer: Any = None) -> None:
        self._mark()
        self._core = core
        self._auto_lock_renewer = auto_lock_renewer
        self.entity_path = core.entity_path
        self.fully_qualified_namespace = core.fully_qualified_namespace
        self.client_identifier = core.client_identifier
        self._session: ServiceBusSession | None = None

    @property
    def session(self) -> ServiceBusSession | None:
        """The session this receiver holds (once open); None for a sessionless receiver."""
        core = self._core.session
        if core is None:
            return None
        if self._session is None:
            self._session = ServiceBusSession(core, self)
        return self._session

    @property
    def _running(self) -> bool:
        # Read by the SDK's AutoLockRenewer on a session's receiver.
        return self._core._running

    @property
    def stats(self) -> ReceiverStats:
        """georep's counters of this receiver."""
        return self._core.stats

    def __enter__(self) -> Self:
        super().__enter__()
        if self._session is None:
            self._register_session()
        return self

    def _register_session(self) -> None:
        # As the SDK's session receiver: its auto_lock_renewer renews the session.
        session = self.session
        if session is not None and self._auto_lock_renewer is not None:
            self._auto_lock_renewer.register(self, session)

    def __iter__(self) -> Iterator[ServiceBusReceivedMessage]:
        return self

    def next(self) -> ServiceBusReceivedMessage:
        """``next(receiver)``, as the SDK's receiver also offers it."""
        return self.__next__()

    def __next__(self) -> ServiceBusReceivedMessage:
        messages = self._registered(self._run(self._core._receive(1, self._core._max_wait_time)))
        if not messages:
            raise StopIteration
        return messages[0]

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.receive_messages`."""
        return self._registered(
            self._run(self._core.receive_messages(max_message_count, max_wait_time))
        )

    def _registered(
        self, messages: list[ServiceBusReceivedMessage]
    ) -> list[ServiceBusReceivedMessage]:
        if self._session is None and self._core.session is not None:
            self._register_session()  # opened by this call
        if self._auto_lock_renewer is not None and self._core.session is None:
            for message in messages:
                self._auto_lock_renewer.register(self, message)
        return messages

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.peek_messages`."""
        return _call(
            self._core.peek_messages(
                max_message_count, sequence_number=sequence_number, timeout=timeout
            )
        )

    def receive_deferred_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.receive_deferred_messages`."""
        return self._registered(
            self._run(self._core.receive_deferred_messages(sequence_numbers, timeout=timeout))
        )

    def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.complete_message`."""
        self._run(self._core.complete_message(message))

    def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.abandon_message`."""
        self._run(self._core.abandon_message(message))

    def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.defer_message`."""
        self._run(self._core.defer_message(message))

    def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.dead_letter_message`."""
        self._run(self._core.dead_letter_message(message, reason, error_description))

    def renew_message_lock(
        self, message: ServiceBusReceivedMessage, *, timeout: float | None = None
    ) -> datetime:
        """As :meth:`georep.servicebus.aio.ServiceBusReceiver.renew_message_lock`."""
        return self._run(self._core.renew_message_lock(message, timeout=timeout))
