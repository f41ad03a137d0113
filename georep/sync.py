"""georep for sync applications: blocking GeoSender, GeoReceiver and ``@receiver``.

The same names, arguments, results and errors as the async API in :mod:`georep`, the way
azure-servicebus ships ``azure.servicebus`` beside ``azure.servicebus.aio``::

    from azure.servicebus import ServiceBusClient, ServiceBusMessage
    import georep.sync

    with georep.sync.GeoSender(sender_a, sender_b) as sender:   # sync SDK senders
        result = sender.send_messages(ServiceBusMessage("hello"))

There is no second implementation: every object here drives the one async core
(:class:`georep.GeoSender`...) on a background event-loop thread. One loop thread serves
the whole process (so senders on one namespace pair share their roles, as in one asyncio
loop); it starts with the first open object and is stopped and joined when the last one
closes. Sync SDK senders and receivers are wrapped in adapters that run their calls on one
worker thread per SDK object (``georep.adapters.servicebus.SyncServiceBusRegionSender``);
those threads are joined on :meth:`GeoSender.close` too.

Ownership as in the async API, with one difference: a sync caller cannot ``await
aclose()``, so the async resources passed in (``seen=``, ``outbox=``, ``ledger=``,
``role_store=``) are closed when the last georep.sync object using them closes. SDK senders
and receivers passed in stay open (their owner closes them).

Every method blocks until the core answers (its deadlines bound that) and raises the
core's errors (:mod:`georep.exceptions`); a closed object raises
:class:`georep.exceptions.ClosedError`. Calling these methods from async code on georep's
own loop thread raises RuntimeError: use the async API there.

After ``os.fork()`` (gunicorn ``--preload``, Celery prefork): a :class:`GeoSender` made by
``from_connection_strings`` without an outbox, ledger or role store reopens in the child
on first use (its own loop thread and connections); every other object made in the parent
raises :class:`ForkedProcessError` at once when the child uses it.
"""

from __future__ import annotations

__all__ = [
    "ForkedProcessError",
    "GeoReceiver",
    "GeoSender",
    "PairedSender",
    "ReceiverHandler",
    "receiver",
]

import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, Self

from georep import _fork
from georep._lifecycle import ClosedOnExit
from georep._region_wrap import wrap_pair
from georep._sync_runtime import RUNTIME, LoopUser, built
from georep.exceptions import ClosedError, ConfigurationError, ForkedProcessError
from georep.paired import sender as _paired_sender
from georep.ports import RegionSender
from georep.receive import receiver as _receiver
from georep.receive.receiver import ReceiverStats
from georep.send import sender as _sender
from georep.send.sender import SenderStats, SendResult

_log = logging.getLogger("georep.sync")

SyncHandler = Callable[[Any], object]

_handler_context = threading.local()
"""``receiver`` is set on a handler thread while it runs that receiver's handler."""


class _Blocking(ClosedOnExit):
    """Holds the loop runtime for one core object and closes everything it was given.

    In a process forked after it was made (gunicorn ``--preload``...), an object that may
    reopen (a GeoSender from connection strings, given no async resources) builds a new
    core there on first use; any other raises :class:`ForkedProcessError` (see
    :mod:`georep._fork`).
    """

    _kind = "object"
    _reopen = False

    def __init__(
        self, factory: Callable[[], Any], *, adapters: Sequence[Any] = (), options: Any = None
    ) -> None:
        self._adapters = list(adapters)
        self._use = LoopUser(options)
        for resource in self._use.resources:  # the parent's store, outbox...: refused at once
            check_process = getattr(resource, "_check_process", None)
            if check_process is not None:
                check_process()
        self._factory = factory
        self._made_after_forks = _fork.fork_count()
        self._made_in = os.getpid()
        self._made = self._use.build(factory, undo=self._close_adapters)

    @classmethod
    def _owning(cls, factory: Callable[[], Any], *, options: Any, reopen: bool = False) -> Self:
        """One over a core that ``factory`` builds with its own clients (no adapters);
        with ``reopen``, rebuilt by ``factory`` in a forked child unless it was given an
        async resource (those belong to the parent)."""
        blocking = cls.__new__(cls)
        _Blocking.__init__(blocking, factory, options=options)
        given = blocking._use.resources
        blocking._reopen = reopen and not given and "role_state" not in options
        return blocking

    @property
    def _core(self) -> Any:
        """The core object, after a fork the child's own (or ForkedProcessError)."""
        if self._made_after_forks != _fork.fork_count():
            self._after_fork()
        return self._made

    def _after_fork(self) -> None:
        with _fork.reopen_lock():
            if self._made_after_forks == _fork.fork_count() or self._use.closed:
                return  # another thread reopened it; or closed: the call raises ClosedError
            if not self._reopen:
                raise _fork.forked_error(f"this georep.sync.{self._kind}", self._made_in)
            # The parent's core is left as it is: closing it would close the parent's
            # connections, and nothing here runs its loop.
            _fork.abandon(self._made)
            try:
                self._made = self._use.build(self._factory)
            except BaseException:
                self._use.closed = True
                raise
            self._use.after_fork()
            parent, self._made_in = self._made_in, os.getpid()
            self._made_after_forks = _fork.fork_count()
        _log.info(
            "georep.sync.%s for %r was created in process %d before a fork: reopened in "
            "process %d with its own connections",
            self._kind,
            self.entity,
            parent,
            self._made_in,
        )

    @property
    def entity(self) -> str:
        """The queue or topic name (a subscription's as ``topic/Subscriptions/name``)."""
        return str(self._made.entity)

    @property
    def _closed(self) -> bool:
        return self._use.closed

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        if self._closed:
            coroutine.close()
            raise ClosedError(f"this georep.sync.{self._kind} is closed; create a new one")
        try:
            self._core  # noqa: B018 - reopens (or raises) in a forked child
        except BaseException:
            coroutine.close()
            raise
        return RUNTIME.call(coroutine)

    def __enter__(self) -> Self:
        try:
            self._call(self._core.__aenter__())
        except BaseException:
            # ``with`` never calls __exit__ when __enter__ raises (a strict start that
            # refused): close here, or the loop thread would outlive the object.
            self.close()
            raise
        return self

    def close(self) -> None:
        """Close the core, the adapters georep made and the resources no one else uses.

        Idempotent and safe from any thread: a second caller waits for the first's close
        to finish. Called from inside a handler (which the close would wait for), it
        starts the close and returns at once.
        """
        if getattr(_handler_context, "receiver", None) is self:
            threading.Thread(target=self.close, name="georep-close", daemon=True).start()
            return
        if self._made_after_forks != _fork.fork_count():
            # Made in the parent, never reopened here: nothing of it is this process's.
            _fork.abandon(self._made)
            self._use.closed = True
            return
        self._use.close(self._aclose)

    async def _aclose(self) -> None:
        try:
            await self._core.aclose()
        finally:
            await self._close_adapters()

    async def _close_adapters(self) -> None:
        for adapter in self._adapters:
            with contextlib.suppress(Exception):
                await adapter.close()


class GeoSender(_Blocking):
    """Blocking :class:`georep.GeoSender`: the same arguments, results and errors.

    Args:
        primary: The primary region's sender: an ``azure.servicebus.ServiceBusSender``
            (sync; its calls run on a worker thread), an async one, or a RegionSender.
        secondary: The secondary region's sender, for the same entity.
        **options: As :class:`georep.GeoSender` (``mode``, ``policy``, ``outbox``...).

    Raises:
        ConfigurationError: As :class:`georep.GeoSender`.
    """

    _kind = "GeoSender"

    def __init__(self, primary: Any, secondary: Any, **options: Any) -> None:
        regions, created = wrap_pair(primary, secondary, "sender")
        super().__init__(
            lambda: _sender.GeoSender(regions[0], regions[1], **options),
            adapters=created,
            options=options,
        )

    @classmethod
    def from_connection_strings(cls, primary: str, secondary: str, **kwargs: Any) -> GeoSender:
        """A GeoSender that creates, and closes, its own clients (as the async one).

        Raises:
            ConfigurationError: A connection string is malformed or the entity is not
                named exactly once. The message never contains the key.
        """
        return cls._owning(
            lambda: _sender.GeoSender.from_connection_strings(primary, secondary, **kwargs),
            options=kwargs,
            reopen=isinstance(primary, str) and isinstance(secondary, str),
        )

    @classmethod
    def from_namespaces(
        cls, primary: Any, secondary: Any, credential: Any = None, **kwargs: Any
    ) -> GeoSender:
        """A GeoSender reaching each namespace with ``credential`` (a sync
        ``TokenCredential`` such as ``azure.identity.DefaultAzureCredential`` works), as
        the async :meth:`georep.GeoSender.from_namespaces`."""
        return cls._owning(
            lambda: _sender.GeoSender.from_namespaces(primary, secondary, credential, **kwargs),
            options=kwargs,
        )

    @property
    def stats(self) -> SenderStats:
        """Live counters of the core sender."""
        stats: SenderStats = self._core.stats
        return stats

    @property
    def active_region(self) -> str:
        """The label of the region passive sends go to now."""
        # Read on the loop: the role state is per event loop.
        return str(self._call(built(lambda: self._core.active_region)))

    def warm_up(self) -> None:
        """Open both regions' links now (see :meth:`georep.GeoSender.warm_up`)."""
        self._call(self._core.warm_up())

    def send_messages(self, message: Any, *, timeout: float | None = None) -> SendResult:
        """Send a message, a list of messages or a batch (as the async method).

        Raises:
            AllRegionsUnavailableError, OutboxFullError, RegionError, ClosedError: As the
                async method.
        """
        result: SendResult = self._call(self._core.send_messages(message, timeout=timeout))
        return result

    def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None
    ) -> Any:
        """Schedule messages; see :meth:`georep.GeoSender.schedule_messages`."""
        return self._call(
            self._core.schedule_messages(messages, schedule_time_utc, timeout=timeout)
        )

    def cancel_scheduled_messages(
        self, sequence_numbers: Mapping[str, Sequence[int]] | Any, *, timeout: float | None = None
    ) -> None:
        """Cancel scheduled messages; see :meth:`georep.GeoSender.cancel_scheduled_messages`."""
        self._call(self._core.cancel_scheduled_messages(sequence_numbers, timeout=timeout))

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> Any:
        """An empty batch that fits both regions (as the async method)."""
        return self._call(self._core.create_message_batch(max_size_in_bytes))

    def drain_outbox(self) -> int:
        """Try once to send everything due in the outbox; return how many were delivered."""
        delivered: int = self._call(self._core.drain_outbox())
        return delivered


HANDLERS_EXIT_WAIT = 5.0
"""Seconds :meth:`GeoReceiver.run` waits, once the receiver is closed, for its handler
threads to end before it returns anyway (a handler stuck for good keeps its thread)."""


def _is_async(handler: Any) -> bool:
    """Whether ``handler`` is an ``async def`` (or an object whose ``__call__`` is one)."""
    call = type(handler).__call__ if callable(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class GeoReceiver(_Blocking):
    """Blocking :class:`georep.GeoReceiver`: :meth:`run` calls a sync handler.

    Args:
        primary: The primary region's peek-lock receiver: an
            ``azure.servicebus.ServiceBusReceiver`` (sync; its calls run on a worker
            thread), an async one, or a RegionReceiver. It stays yours: if an outage
            leaves a receive stuck inside the sync SDK, georep cannot replace it and that
            region is not read until the SDK returns (an error is logged; see
            docs/receiver.md §17a). :meth:`from_connection_strings` has no such limit.
        secondary: The secondary region's receiver.
        seen: The shared seen-set (e.g. ``georep.adapters.redis.RedisSeenSet``); closed
            when the last georep.sync object using it closes.
        **options: As :class:`georep.GeoReceiver` (``concurrency``, ``lease``...).

    Raises:
        ConfigurationError: As :class:`georep.GeoReceiver`.
    """

    _kind = "GeoReceiver"
    _run_future: concurrent.futures.Future[None] | None = None

    def __init__(self, primary: Any, secondary: Any, *, seen: Any, **options: Any) -> None:
        regions: list[Any]
        created: list[Any]
        if options.get("sessions"):  # RegionSessions, checked by the core
            regions, created = [primary, secondary], []
        else:
            regions, created = wrap_pair(primary, secondary, "receiver")
        super().__init__(
            lambda: _receiver.GeoReceiver(regions[0], regions[1], seen=seen, **options),
            adapters=created,
            options={**options, "seen": seen},
        )

    @classmethod
    def from_connection_strings(
        cls, primary: str, secondary: str, *, seen: Any, **kwargs: Any
    ) -> GeoReceiver:
        """A GeoReceiver that creates, and closes, its own clients (as the async one).

        Name ``queue_name=``, or ``topic_name=`` and ``subscription_name=``. Its SDK
        receivers run on georep's loop thread; one whose receive overran its deadline (a
        link an outage dropped) is discarded and reopened, so both regions are read again
        once they are back.

        Raises:
            ConfigurationError: A connection string is malformed or the entity is not
                named properly. The message never contains the key.
        """
        return cls._owning(
            lambda: _receiver.GeoReceiver.from_connection_strings(
                primary, secondary, seen=seen, **kwargs
            ),
            options={**kwargs, "seen": seen},
        )

    @classmethod
    def from_namespaces(
        cls, primary: Any, secondary: Any, credential: Any = None, *, seen: Any, **kwargs: Any
    ) -> GeoReceiver:
        """A GeoReceiver reaching each namespace with ``credential``, as the async
        :meth:`georep.GeoReceiver.from_namespaces`."""
        return cls._owning(
            lambda: _receiver.GeoReceiver.from_namespaces(
                primary, secondary, credential, seen=seen, **kwargs
            ),
            options={**kwargs, "seen": seen},
        )

    @property
    def stats(self) -> ReceiverStats:
        """Live counters of the core receiver."""
        stats: ReceiverStats = self._core.stats
        return stats

    def run(self, handler: SyncHandler) -> None:
        """Receive and process until :meth:`close` (from another thread) or Ctrl-C.

        Args:
            handler: ``def handle(message)``, run on a worker thread (up to
                ``concurrency`` at once per region), never on georep's loop thread.
                Raising means "not processed"; it may decide the outcome with
                :meth:`dead_letter_message` and the other outcome methods.

        Raises:
            ClosedError: The receiver was closed.
            KeyboardInterrupt: After a graceful stop (in-flight handlers finished and
                settled), re-raised so the application exits as usual.
        """
        if self._closed:
            raise ClosedError("this georep.sync.GeoReceiver is closed; create a new one")
        if _is_async(handler):
            raise ConfigurationError(
                f"{getattr(handler, '__name__', handler)!r} is an async def: "
                "georep.sync.GeoReceiver runs blocking handlers (def handle(message)); give "
                "an async handler to georep.GeoReceiver (asyncio) instead"
            )
        core = self._core
        loop = RUNTIME.loop
        # Per region: up to concurrency handlers, or one per held session in session mode.
        per_region = max(core.concurrency, getattr(core, "max_sessions", 0) + 4)
        pool_prefix = f"georep-handler-{id(self):x}"
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2 * per_region, thread_name_prefix=pool_prefix
        )

        def run_handler(message: Any) -> object:
            _handler_context.receiver = self
            try:
                result = handler(message)
            finally:
                _handler_context.receiver = None
            if inspect.isawaitable(result):
                # Never "processed": the coroutine's work did not run (a callable that
                # returns one was not recognised as async above).
                getattr(result, "close", lambda: None)()
                raise ConfigurationError(
                    "the handler returned an awaitable: georep.sync.GeoReceiver runs "
                    "blocking handlers; use georep.GeoReceiver for async ones"
                )
            return result

        async def call(message: Any) -> object:
            # As asyncio.to_thread: the handler sees the context the core set for it.
            context = contextvars.copy_context()
            return await loop.run_in_executor(pool, context.run, run_handler, message)

        try:
            self._run_future = RUNTIME.submit(core.run(call))
            self._wait_for_run(self._run_future)
        finally:
            # Not waited for: the core has let go of its handlers by now (a handler still
            # running past the close's bound was given up on, its message left to its lock
            # and lease), and run() returning is what lets the application shut down.
            pool.shutdown(wait=False, cancel_futures=True)
            # Idle workers end at once: wait for them (bounded), not for a stuck handler.
            deadline = time.monotonic() + HANDLERS_EXIT_WAIT
            for thread in [t for t in threading.enumerate() if t.name.startswith(pool_prefix)]:
                thread.join(max(0.0, deadline - time.monotonic()))
            stuck = [t.name for t in threading.enumerate() if t.name.startswith(pool_prefix)]
            if stuck:
                _log.warning(
                    "georep.sync.GeoReceiver.run() returns with %d handler(s) still running "
                    "(%s): their messages go back when their locks expire",
                    len(stuck),
                    ", ".join(stuck),
                )

    def _wait_for_run(self, future: concurrent.futures.Future[None]) -> None:
        try:
            future.result()
        except KeyboardInterrupt:
            # Stop gracefully (the core finishes and settles in-flight handlers), then let
            # the interrupt end the application.
            self.close()
            with contextlib.suppress(Exception):
                future.result()
            raise
        # cancellation: a thread's future, not a task: the run was cancelled by close()
        except concurrent.futures.CancelledError:
            return

    def peek_all(self, count: int) -> dict[str, list[Any]]:
        """Up to ``count`` messages from each region, without locking them."""
        peeked: dict[str, list[Any]] = self._call(self._core.peek_all(count))
        return peeked

    # ----------------------------------------------------------- handler outcomes
    # Recorded by the core (no I/O) and applied after the handler returns.

    def complete_message(self, message: Any) -> None:
        """Decide: complete ``message`` (the default when the handler returns)."""
        self._outcome("complete_message", message)

    def abandon_message(self, message: Any) -> None:
        """Decide: abandon ``message`` (redelivered; the default when the handler raises)."""
        self._outcome("abandon_message", message)

    def defer_message(self, message: Any) -> None:
        """Decide: defer ``message`` (kept in the entity, receivable by sequence number)."""
        self._outcome("defer_message", message)

    def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        """Decide: dead-letter ``message`` in its region; its twin gets the same outcome."""
        self._outcome(
            "dead_letter_message", message, reason=reason, error_description=error_description
        )

    def get_session_state(self, message: Any) -> bytes | None:
        """The state of ``message``'s session (session mode); see
        :meth:`georep.GeoReceiver.get_session_state`."""
        state: bytes | None = RUNTIME.call(self._core.get_session_state(message))
        return state

    def set_session_state(self, message: Any, state: bytes | str | None) -> None:
        """Set the state of ``message``'s session for both regions (session mode)."""
        RUNTIME.call(self._core.set_session_state(message, state))

    def _outcome(self, name: str, *args: Any, **kwargs: Any) -> None:
        # Not self._call: a handler still running while close() waits for it may decide.
        RUNTIME.call(getattr(self._core, name)(*args, **kwargs))


class ReceiverHandler:
    """What ``@georep.sync.receiver(...)`` returns: the handler, still callable, plus run().

    Attributes:
        stats: Live counters (:class:`georep.ReceiverStats`), once running.
    """

    def __init__(self, function: SyncHandler, factory: Callable[[], GeoReceiver]) -> None:
        self._function = function
        self._factory = factory
        self._receiver: GeoReceiver | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.__name__ = getattr(function, "__name__", "handler")
        self.__doc__ = getattr(function, "__doc__", None)

    def __call__(self, message: Any) -> object:
        return self._function(message)

    @property
    def stats(self) -> ReceiverStats:
        return self._receiver.stats if self._receiver is not None else ReceiverStats()

    def run(self) -> None:
        """Receive and process until :meth:`close` (from another thread) or Ctrl-C.

        Raises:
            ClosedError: :meth:`close` was called.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("this receiver handler is closed; decorate a new one")
            if self._receiver is None:
                self._receiver = self._factory()
            receiver = self._receiver
        receiver.run(self._function)

    def close(self) -> None:
        """Stop gracefully: finish in-flight handlers, settle, close. Idempotent."""
        with self._lock:
            self._closed = True
            receiver = self._receiver
        if receiver is not None:
            receiver.close()

    def _running(self) -> GeoReceiver:
        if self._receiver is None:
            raise ClosedError("the handler's receiver is not running")
        return self._receiver

    def complete_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.complete_message`."""
        self._running().complete_message(message)

    def abandon_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.abandon_message`."""
        self._running().abandon_message(message)

    def defer_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.defer_message`."""
        self._running().defer_message(message)

    def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        """As :meth:`GeoReceiver.dead_letter_message`."""
        self._running().dead_letter_message(
            message, reason=reason, error_description=error_description
        )


def receiver(
    *,
    primary: Any,
    secondary: Any,
    queue_name: str | None = None,
    topic_name: str | None = None,
    subscription_name: str | None = None,
    seen: Any,
    **options: Any,
) -> Callable[[SyncHandler], ReceiverHandler]:
    """Decorate ``def handle(message)`` to receive each logical message once (blocking).

    As :func:`georep.receiver`: ``primary``/``secondary`` are SDK receivers (sync or
    async) or RegionReceivers, or connection strings with ``queue_name`` (or
    ``topic_name`` and ``subscription_name``); other options go to :class:`GeoReceiver`.
    The returned object is still callable and has ``run()`` (blocking), ``close()``,
    ``stats`` and the outcome methods::

        @georep.sync.receiver(primary=conn_a, secondary=conn_b, queue_name="orders", seen=seen)
        def handle(message): ...

        handle.run()
    """

    names = (queue_name, topic_name, subscription_name)
    return _receiver.receiver_decorator(
        GeoReceiver, ReceiverHandler, primary, secondary, seen, names, options
    )


class PairedSender(_Blocking):
    """Blocking :class:`georep.PairedSender` (paired namespaces, SPEC §3).

    Build it with :meth:`from_connection_strings`; the constructor takes the same
    arguments as :class:`georep.PairedSender` (RegionSenders).
    """

    _kind = "PairedSender"

    def __init__(
        self, primary: RegionSender, backlog: Sequence[RegionSender], **options: Any
    ) -> None:
        super().__init__(
            lambda: _paired_sender.PairedSender(primary, backlog, **options), options=options
        )

    @classmethod
    def from_connection_strings(cls, primary: str, secondary: str, **kwargs: Any) -> PairedSender:
        """A PairedSender that creates, and closes, its senders (as the async one)."""
        return cls._owning(
            lambda: _paired_sender.PairedSender.from_connection_strings(
                primary, secondary, **kwargs
            ),
            options=kwargs,
        )

    @classmethod
    def from_namespaces(
        cls, primary: Any, secondary: Any, credential: Any = None, **kwargs: Any
    ) -> PairedSender:
        """A PairedSender reaching each namespace with ``credential`` (as the async one)."""
        return cls._owning(
            lambda: _paired_sender.PairedSender.from_namespaces(
                primary, secondary, credential, **kwargs
            ),
            options=kwargs,
        )

    def send_messages(self, message: Any, *, timeout: float | None = None) -> Any:
        """Send; see :meth:`georep.PairedSender.send_messages`."""
        return self._call(self._core.send_messages(message, timeout=timeout))
