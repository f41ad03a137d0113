"""The one event-loop thread that :mod:`georep.sync` drives the async core on.

One loop per process, not one per object: every GeoSender on a namespace pair in one loop
shares its role state (a failover seen by one sender is seen by all), and a process with
ten sync senders has one extra thread, not ten. The thread starts with the first open
``georep.sync`` object and is stopped and joined when the last one closes, so a closed
application has no georep thread left.

In a forked child the loop thread does not exist (only the thread that called ``fork``
is copied): the runtime forgets the parent's loop there, and the next georep.sync object
to need one starts its own (see :mod:`georep._fork` for what happens to the objects).

Async resources a sync caller hands over (``seen=``, ``outbox=``, ``ledger=``) live on
that loop. A sync caller cannot ``await aclose()`` them, and the loop they are bound to
stops with the last sync object, so each is closed when the last sync object using it
closes.
"""

from __future__ import annotations

__all__ = ["RESOURCE_OPTIONS", "RUNTIME", "LoopRuntime", "LoopUser", "built"]

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from georep import _fork
from georep._lifecycle import STOP_TIMEOUT
from georep.exceptions import ClosedError

_T = TypeVar("_T")
_JOIN_SECONDS = 30.0
#: Seconds the tasks left on the loop get to end, once cancelled, when the loop stops.
_STOP_SECONDS = STOP_TIMEOUT

_log = logging.getLogger("georep")

#: The options that hand a sync object an async resource.
RESOURCE_OPTIONS = ("seen", "outbox", "ledger", "role_store")


class LoopRuntime:
    """A reference-counted event loop on a daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._users = 0
        self._held: dict[int, list[Any]] = {}

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's loop (its thread is not here) and start
        afresh. The loop object is kept, never run nor closed: its selector and sockets
        are the parent's too."""
        _fork.abandon(self._loop)
        self._lock = threading.Lock()  # a parent thread may have held it at the fork
        self._loop = self._thread = None
        self._users = 0
        self._held = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop.

        Raises:
            ClosedError: No georep.sync object is open.
        """
        loop = self._loop
        if loop is None:
            raise ClosedError("georep's loop thread is stopped: every georep.sync object is closed")
        return loop

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread while one is running."""
        return self._thread

    def acquire(self) -> None:
        """Count one more user; start the loop thread for the first."""
        with self._lock:
            self._users += 1
            if self._loop is not None:
                return
            loop = asyncio.new_event_loop()
            started = threading.Event()
            thread = threading.Thread(
                target=_serve, args=(loop, started), name="georep-sync-loop", daemon=True
            )
            thread.start()
            started.wait()
            self._loop, self._thread = loop, thread

    def release(self) -> None:
        """Count one user less; stop and join the loop thread after the last."""
        with self._lock:
            self._users -= 1
            if self._users > 0 or self._loop is None:
                return
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_SECONDS)

    def submit(self, coroutine: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Schedule ``coroutine`` on the loop; the caller waits on the returned future.

        Raises:
            ClosedError: The loop is stopped.
            RuntimeError: Called from the loop's own thread (it would wait for itself).
        """
        try:
            loop = self.loop
            if threading.current_thread() is self._thread:
                raise RuntimeError(
                    "a georep.sync method was called on georep's event-loop thread (from "
                    "async code): use the async API (georep.GeoSender...) there"
                )
        except BaseException:
            coroutine.close()
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coroutine`` on the loop and wait for it; its exception is raised as is.

        An interrupt (Ctrl-C) while waiting cancels the coroutine and is re-raised.
        """
        future = self.submit(coroutine)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise ClosedError("the call was cancelled: georep's loop thread stopped") from None
        except BaseException:
            future.cancel()
            raise

    def hold(self, resource: object) -> None:
        """Count one more sync object using ``resource`` (an async store, outbox, ledger)."""
        with self._lock:
            entry = self._held.setdefault(id(resource), [resource, 0])
            entry[1] += 1

    def drop(self, resource: object) -> bool:
        """Count one user of ``resource`` less; True when it was the last (close it now)."""
        with self._lock:
            entry = self._held.get(id(resource))
            if entry is None:
                return False
            entry[1] -= 1
            if entry[1] > 0:
                return False
            del self._held[id(resource)]
            return True


class LoopUser:
    """One sync object's use of :data:`RUNTIME`, and of the async resources among its
    options (``seen=``, ``outbox=``, ``ledger=``, ``role_store=``).

    :meth:`build` starts using the loop and builds the object's async core there;
    :meth:`close` runs the core's close on the loop, closes each resource no other sync
    object holds any more, and stops using the loop.

    Args:
        options: The options the sync object was given (None: none).
    """

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.closed = False
        self._close_lock = threading.Lock()
        self.resources = [
            value
            for name in RESOURCE_OPTIONS
            if (value := (options or {}).get(name)) is not None and hasattr(value, "aclose")
        ]

    def build(
        self,
        factory: Callable[[], _T],
        *,
        undo: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> _T:
        """Start using the loop, run ``factory`` on it (the core may look up the running
        loop as it is built) and hold the resources. If ``factory`` raises: ``undo()`` on
        the loop, stop using the loop, and raise."""
        RUNTIME.acquire()
        try:
            made = RUNTIME.call(built(factory))
        except BaseException:
            try:
                if undo is not None:
                    RUNTIME.call(undo())
            finally:
                RUNTIME.release()
            raise
        for resource in self.resources:
            RUNTIME.hold(resource)
        return made

    def after_fork(self) -> None:
        """In a forked child that rebuilt the core: a parent thread may have held the close
        lock at the fork."""
        self._close_lock = threading.Lock()

    def close(self, closing: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``closing()`` on the loop, close the resources this object was the last
        user of, and stop using the loop. Idempotent and safe from any thread: a second
        caller waits for the first's close to finish."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
            try:
                RUNTIME.call(self._close(closing))
            finally:
                RUNTIME.release()

    async def _close(self, closing: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            await closing()
        finally:
            for resource in self.resources:
                if RUNTIME.drop(resource):
                    with contextlib.suppress(Exception):
                        await resource.aclose()


async def built(factory: Callable[[], _T]) -> _T:
    """``factory()``, as a coroutine to run on the loop: a core object may look up the
    running loop while it is built."""
    return factory()


def _serve(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    try:
        loop.run_forever()
    finally:
        # Stopped with the last sync object: whatever is left was abandoned by its caller.
        # Cancelled, and waited for a bounded time: a task that swallows its cancellation
        # must not keep this thread (and the loop) alive for ever.
        leftovers = asyncio.all_tasks(loop)
        for task in leftovers:
            task.cancel()
        with contextlib.suppress(Exception):
            if leftovers:
                loop.run_until_complete(asyncio.wait(leftovers, timeout=_STOP_SECONDS))
            stuck = [task for task in leftovers if not task.done()]
            for task in leftovers:
                if task.done() and not task.cancelled():
                    task.exception()  # seen: its caller is gone
            for task in stuck:
                # Said once below: asyncio need not add "Task was destroyed but it is
                # pending" for each when the closed loop lets go of them.
                task._log_destroy_pending = False  # type: ignore[attr-defined]
            if stuck:
                _log.warning(
                    "%d task(s) on georep's loop thread did not end within %g s of being "
                    "cancelled; the loop closes without them",
                    len(stuck),
                    _STOP_SECONDS,
                )
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


RUNTIME = LoopRuntime()
"""The process's runtime, shared by every georep.sync object."""

os.register_at_fork(after_in_child=RUNTIME.forget_after_fork)
