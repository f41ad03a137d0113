"""georep's ports on the azure-servicebus *sync* SDK: one worker thread per SDK object.

``azure.servicebus.ServiceBusSender`` and ``ServiceBusReceiver`` block and are not safe
for concurrent calls. georep's core is asyncio, so every call on a sync SDK object runs on
that object's own worker thread, one call at a time, in the order the core made them; the
event loop awaits the result and never blocks.

Deadlines. The core bounds every await with its deadline (``Clock.deadline``), and the SDK
gets the same number as ``timeout=``, so a worker thread normally comes back on its own
soon after the core gave up. A call whose await was cancelled before the worker started it
is never started (a send the core already counted as failed is not sent later). A call that
the SDK never lets go of (a lost response the SDK's own timeout does not cover) keeps the
worker busy: calls queued behind it are not run concurrently on the same SDK object (that
would corrupt it), so each of them fails at its own deadline with a TIMEOUT error, which
the core treats as "region unavailable" and fails over. Nothing waits forever; the worker
takes calls again once the stuck one returns.

Threads. The worker of an SDK object is shared by every adapter wrapping that object (like
the async adapter's :class:`georep.ports.RegionSlot`). It is started on the first call,
exits after ``idle_exit`` seconds without work (so a core that never closes the adapters
it created leaves no thread behind for long) and is stopped and joined by :meth:`close`
of the last adapter using it. Worker threads are daemons: a call stuck in the SDK never
keeps the interpreter from exiting.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_IDLE_EXIT",
    "RegionWorker",
    "SyncServiceBusRegionReceiver",
    "SyncServiceBusRegionSender",
    "region_worker",
]

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from azure.servicebus import ServiceBusReceiver, ServiceBusSender

from georep.exceptions import ClosedError, GeoReplicationError, region_error
from georep.ports import ErrorKind
from georep.receive.peek import peek_all

from . import _receiver
from ._receiver import ServiceBusRegionReceiver
from ._region import SdkRegion
from ._sender import ServiceBusRegionSender

_log = logging.getLogger("georep.adapters.servicebus")
_T = TypeVar("_T")

DEFAULT_IDLE_EXIT = 5.0
"""Seconds a worker thread waits for work before it exits (restarted on the next call)."""

_STOP_JOIN_SECONDS = 10.0
_Job = tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None


class RegionWorker:
    """One thread that runs the calls on one SDK object, one at a time, in order.

    Args:
        name: The thread's name (shows in ``threading.enumerate()`` and thread dumps).
        idle_exit: Seconds without work after which the thread exits (default 5.0).
    """

    def __init__(self, name: str, *, idle_exit: float = DEFAULT_IDLE_EXIT) -> None:
        self.name = name
        self._idle_exit = idle_exit
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self.users = 0

    @property
    def thread(self) -> threading.Thread | None:
        """The running thread, if any."""
        return self._thread

    def submit(self, function: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Queue ``function`` for the worker thread (started if it is not running)."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._lock:
            self._jobs.put((future, function))
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
        return future

    async def run(self, function: Callable[[], _T]) -> _T:
        """Await ``function()`` run on the worker thread.

        Cancelling the await (the core's deadline) cancels the call if it has not started;
        a call already running finishes on the thread and its result is dropped.
        """
        return await asyncio.wrap_future(self.submit(function))

    def stop(self, timeout: float = _STOP_JOIN_SECONDS) -> bool:
        """Let the thread finish the queued calls, then exit; join it for ``timeout`` s.

        Returns:
            True when no thread is left; False when a call is stuck in the SDK (the daemon
            thread then exits once the SDK lets go).
        """
        with self._lock:
            thread = self._thread
            if thread is None:
                return True
            self._jobs.put(None)
        if thread is threading.current_thread():
            return False
        thread.join(timeout)
        if thread.is_alive():
            _log.warning(
                "%s is still inside an SDK call after %.0f s; left to finish on its own",
                self.name,
                timeout,
            )
            return False
        return True

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_exit)
            except queue.Empty:
                job = None
            if job is None:
                # Idle, or told to stop: exit only if nothing arrived meanwhile (decided
                # under the lock submit() takes, so no call is ever left without a thread).
                with self._lock:
                    if self._pending == 0:
                        self._thread = None
                        return
                continue
            future, function = job
            with self._lock:
                self._pending -= 1
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it started: never run it late
            try:
                result = function()
            # cancellation: a worker thread hands whatever its job raised to the job's future
            except BaseException as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)
            else:
                future.set_result(result)


_WORKERS: weakref.WeakKeyDictionary[Any, RegionWorker] = weakref.WeakKeyDictionary()
_WORKERS_LOCK = threading.Lock()


def region_worker(
    sdk_object: Any, *, region: str, idle_exit: float = DEFAULT_IDLE_EXIT
) -> RegionWorker:
    """The worker thread of ``sdk_object``, shared by every adapter that wraps it."""
    with _WORKERS_LOCK:
        worker = _WORKERS.get(sdk_object)
        if worker is None:
            entity = getattr(sdk_object, "entity_name", None) or getattr(
                sdk_object, "entity_path", "?"
            )
            worker = _WORKERS[sdk_object] = RegionWorker(
                f"georep-sb-{region}-{entity}", idle_exit=idle_exit
            )
        worker.users += 1
        return worker


def _release_worker(worker: RegionWorker) -> None:
    with _WORKERS_LOCK:
        worker.users -= 1
        last = worker.users <= 0
    if last:
        worker.stop()


class _OnWorker(SdkRegion):
    """What both sync adapters share: every SDK call on the SDK object's worker thread,
    and closing releases the worker (never the caller's SDK object)."""

    def __init__(self, sdk: Any, *, region: str, idle_exit: float) -> None:
        # The next base is the async adapter (ServiceBusRegionSender or -Receiver): it
        # reads the same attributes on a sync SDK object and keys its slot by the object,
        # whatever its flavour.
        super().__init__(sdk, region=region)  # type: ignore[call-arg]
        self._worker: RegionWorker | None = region_worker(sdk, region=region, idle_exit=idle_exit)

    @property
    def worker(self) -> RegionWorker:
        """The worker thread this adapter's calls run on."""
        if self._worker is None:
            raise ClosedError(f"the {self.region} adapter is closed; wrap the SDK object again")
        return self._worker

    async def _call(self, operation: Callable[[], Any]) -> Any:
        # The base classes build a call to the SDK and hand it here: on the sync SDK it
        # runs on the worker and returns a value.
        try:
            return await self.worker.run(operation)
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            raise self._translate(exc) from exc

    async def close(self) -> None:
        """Stop this adapter's use of the worker thread (joined when no adapter uses it).

        The caller's SDK object stays open.
        """
        worker, self._worker = self._worker, None
        if worker is not None:
            await asyncio.to_thread(_release_worker, worker)


class SyncServiceBusRegionSender(_OnWorker, ServiceBusRegionSender):
    """One region's sync ``azure.servicebus.ServiceBusSender`` behind georep's port.

    Same behaviour as :class:`ServiceBusRegionSender` (errors through ``translate_error``,
    the same codec, one :class:`georep.ports.RegionSlot` per SDK sender), with every SDK
    call run on the sender's worker thread (see the module docstring for deadlines).

    Args:
        sender: The caller's sync SDK sender; never closed by georep.
        region: The region's label.
        idle_exit: Seconds an idle worker thread lingers (default 5.0).
    """

    def __init__(
        self, sender: ServiceBusSender, *, region: str, idle_exit: float = DEFAULT_IDLE_EXIT
    ) -> None:
        super().__init__(sender, region=region, idle_exit=idle_exit)
        self._sync_sender = sender

    async def send(self, messages: Any, *, timeout: float) -> None:
        await self._call(partial(self._sync_sender.send_messages, messages, timeout=timeout))


class _PeekOnWorker:
    """Lends a sync receiver's ``peek_messages`` to :func:`georep.receive.peek.peek_all`,
    on the worker."""

    def __init__(self, receiver: ServiceBusReceiver, worker: RegionWorker) -> None:
        self._receiver = receiver
        self._worker = worker

    async def peek_messages(self, **kwargs: Any) -> list[Any]:
        return list(await self._worker.run(partial(self._receiver.peek_messages, **kwargs)))


class SyncServiceBusRegionReceiver(_OnWorker, ServiceBusRegionReceiver):
    """One region's sync peek-lock ``azure.servicebus.ServiceBusReceiver`` behind the port.

    Same behaviour as :class:`ServiceBusRegionReceiver`, every SDK call on the receiver's
    worker thread.

    A stuck receive. The sync SDK can stay inside ``receive_messages`` on a link an outage
    dropped, and a thread cannot be interrupted. When the core gives up on a receive that
    ran ``STUCK_AFTER`` seconds past its ``max_wait``, the adapter logs an error and,
    until that SDK call returns, fails every receive at once with
    :class:`~georep.exceptions.RegionUnavailableError` (kind TIMEOUT) naming the cause,
    instead of queueing calls behind it: the region is not read by this receiver
    meanwhile (its copies are taken from the other region, or by other consumers). The
    SDK receiver is the caller's, so georep cannot close it and open another; a
    GeoReceiver built with ``from_connection_strings`` owns its receivers and reopens them.
    Once the SDK call returns, the region is read again.

    Args:
        receiver: The caller's sync SDK receiver, in PEEK_LOCK mode; never closed by georep.
        region: The region's label.
        idle_exit: Seconds an idle worker thread lingers (default 5.0).

    Raises:
        ConfigurationError: The receiver is in RECEIVE_AND_DELETE mode.
    """

    def __init__(
        self, receiver: ServiceBusReceiver, *, region: str, idle_exit: float = DEFAULT_IDLE_EXIT
    ) -> None:
        super().__init__(receiver, region=region, idle_exit=idle_exit)
        self._sync_receiver = receiver
        self._receive_started = 0.0
        self._stuck: concurrent.futures.Future[list[Any]] | None = None
        self._stuck_since = 0.0

    @property
    def stuck(self) -> bool:
        """True while a receive the core gave up on is still inside the SDK."""
        return self._stuck is not None and not self._stuck.done()

    def _receive(self, max_messages: int, max_wait: float) -> list[Any]:
        self._receive_started = time.monotonic()
        if not self._link_open:
            # As the async adapter: open the link with the SDK's own open timeouts first.
            self._sync_receiver.__enter__()
            self._link_open = True
        return list(
            self._sync_receiver.receive_messages(
                max_message_count=max_messages, max_wait_time=max_wait
            )
        )

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        self._check_stuck()
        # Set again when the call starts on the worker (it may wait behind a settlement).
        self._receive_started = time.monotonic()
        call = self.worker.submit(partial(self._receive, max_messages, max_wait))
        try:
            return await asyncio.wrap_future(call)
        except asyncio.CancelledError:
            overran = time.monotonic() - self._receive_started
            if call.running() and overran > max_wait + _receiver.STUCK_AFTER:
                self._mark_stuck(call)
            raise
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            self._link_open = False
            raise self._translate(exc) from exc

    def _mark_stuck(self, call: concurrent.futures.Future[list[Any]]) -> None:
        self._stuck, self._stuck_since = call, self._receive_started
        self._link_open = False  # reopened on the next receive once the call returns
        _log.error(
            "%s (%s): the sync SDK receiver has been inside receive_messages for %.0f s (its "
            "link was probably dropped by an outage). georep cannot reopen a receiver it did "
            "not create: this region is not read by this receiver until the SDK call returns. "
            "Build the GeoReceiver with from_connection_strings(...) to let georep reconnect.",
            self.region,
            self.namespace,
            time.monotonic() - self._receive_started,
        )

    def _check_stuck(self) -> None:
        call = self._stuck
        if call is None:
            return
        if call.done():
            self._stuck = None
            _log.warning(
                "%s (%s): the stuck receive returned after %.0f s; reading the region again",
                self.region,
                self.namespace,
                time.monotonic() - self._stuck_since,
            )
            return
        raise region_error(
            f"{self.region} ({self.namespace}): the sync SDK receiver is stuck in "
            f"receive_messages for {time.monotonic() - self._stuck_since:.0f} s; georep cannot "
            "reopen a receiver it did not create (use from_connection_strings)",
            region=self.region,
            kind=ErrorKind.TIMEOUT,
        )

    async def peek(self, count: int) -> list[Any]:
        try:
            return await peek_all(_PeekOnWorker(self._sync_receiver, self.worker), count)
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            raise self._translate(exc) from exc

    # complete, abandon, defer and dead_letter are the base class's, through _call.

    async def renew_lock(self, message: Any) -> float | None:
        expiry = await self._call(partial(self._sync_receiver.renew_message_lock, message))
        return expiry.timestamp() if expiry is not None else None
