"""The lifecycle every public async georep object shares.

``async with`` opens and closes; :meth:`AsyncResource.aclose` is idempotent and shielded (a
caller cancelled mid-close does not leave owned connections open); ``close()`` is the SDK's
name for it. A subclass writes only what is its own: :meth:`~AsyncResource._open` and
:meth:`~AsyncResource._close`. :func:`close_all` closes what an object created, concurrently
and bounded, so one stuck client never keeps the others open; :func:`close_in_order` runs
close steps one after the other, each whatever the one before it did.

Background tasks have one owner: :func:`start_task` starts one (its crash is logged when it
happens, not when someone awaits it), :func:`stop_task` / :func:`stop_tasks` stop it
(cancel, a bounded wait, a log line when it did not end, and the caller's own cancellation
re-raised, never swallowed); :func:`run_owned` waits for a group of them and stops the
rest when one fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Final, Protocol, Self, TypeVar

from georep import _fork
from georep.exceptions import AllRegionsUnavailableError, ClosedError, RegionError
from georep.ports import Clock

_log = logging.getLogger("georep")

_T = TypeVar("_T")

#: Seconds a cancelled background task gets to end before its owner gives up waiting for
#: it (and logs so). Cancelling ends georep's own tasks at their next await; only a call
#: that swallows cancellation (a handler, an SDK call) can take longer.
STOP_TIMEOUT: Final = 5.0


class _Closeable(Protocol):
    async def close(self) -> None: ...


class AsyncResource:
    """Context manager with an idempotent, shielded close.

    Subclasses implement :meth:`_close` (and :meth:`_open` when entering does work) and call
    :meth:`_check_open` at the top of every public operation.
    """

    _closed: bool = False
    _close_task: asyncio.Future[None] | None = None
    _made_after_forks: int = 0
    _made_in: int = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # Stamped here, not in __init__: subclasses write their own __init__.
        resource = super().__new__(cls)
        resource._made_after_forks = _fork.fork_count()
        resource._made_in = os.getpid()
        return resource

    async def __aenter__(self) -> Self:
        self._check_process()
        self._check_open()
        await self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed

    async def aclose(self) -> None:
        """Close this object and what it created. Idempotent; a second call waits for the
        first one's close to finish. In a process forked after it was made, it is only
        marked closed: what it holds belongs to the parent."""
        if self._made_after_forks != _fork.fork_count():
            self._closed = True
            return
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close())
        # Shielded: a caller cancelled mid-close must not leave owned connections open.
        await asyncio.shield(self._close_task)

    async def close(self) -> None:
        """Same as :meth:`aclose` (the SDK's name)."""
        await self.aclose()

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            name = type(self).__name__
            raise ClosedError(f"this {name} is closed; create a new {name}")

    def _check_process(self) -> None:
        """Raise :class:`georep._fork.ForkedProcessError` in a process forked after this
        object was made (a subclass's own ``_check_open`` calls it too)."""
        if self._made_after_forks != _fork.fork_count():
            raise _fork.forked_error(f"this {type(self).__name__}", self._made_in)

    async def _open(self) -> None:
        """Work done on ``async with`` entry; nothing by default."""

    async def _close(self) -> None:
        """Release what this object holds; runs once."""


class ClosedOnAsyncExit:
    """``async with`` closes the object on the way out, as it does the SDK's clients; a
    class that does work on entry overrides :meth:`__aenter__`."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class ClosedOnExit:
    """``with`` closes the (blocking) object on the way out, as it does the SDK's clients;
    a class that does work on entry overrides :meth:`__enter__`."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- background tasks --------------------------------------------------------------------

_started: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()
"""Tasks :func:`start_task` started: their end is logged by their own callback."""


def start_task(coroutine: Coroutine[Any, Any, _T], *, name: str) -> asyncio.Task[_T]:
    """Start ``coroutine`` as a background task whose abnormal end is logged at once.

    A background task nobody awaits until it is stopped would otherwise die silently (its
    exception surfaces, if ever, when the owner stops it). Its owner stops it with
    :func:`stop_task`.

    Args:
        coroutine: The task's work.
        name: The task's name, as logs show it (``georep-ping orders``).
    """
    task = asyncio.create_task(coroutine, name=name)
    _started.add(task)
    task.add_done_callback(_log_end)
    return task


def _log_end(task: asyncio.Future[Any]) -> None:
    """Log how a background task ended, when it ended abnormally (an exception)."""
    if task.cancelled():
        return
    error = task.exception()  # retrieved: asyncio does not report it again
    if error is not None:
        name = task.get_name() if isinstance(task, asyncio.Task) else "a georep task"
        _log.error("background task %s ended with %s", name, type(error).__name__, exc_info=error)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark the exception of a task stopped by its owner as seen (its owner stopped it:
    what it raised on the way out is of no further use), logging it at debug level."""
    if task.cancelled() or task in _started:
        return
    error = task.exception()
    if error is not None:
        _log.debug("a stopped task ended with %s", type(error).__name__)


async def wait_within(awaitable: Awaitable[_T], seconds: float) -> _T:
    """``await awaitable``, raising ``TimeoutError`` after ``seconds`` (it is cancelled).

    ``asyncio.wait_for`` does the same, but on Python 3.11 it returns a result that arrives
    together with the caller's cancellation, which is then lost; ``asyncio.timeout`` keeps
    it. georep's code uses this (tests/unit/test_cancellation_shape.py checks).
    """
    async with asyncio.timeout(seconds):
        return await awaitable


async def finish_task(
    task: asyncio.Future[Any] | None,
    *,
    timeout: float,
    clock: Clock | None = None,
) -> bool:
    """Wait at most ``timeout`` s for ``task`` (one the caller owns, already told to end)
    to end by itself, then stop it (:func:`stop_task`).

    The ``wait_for`` + ``suppress(CancelledError)`` it replaces swallowed the caller's own
    cancellation (a Ctrl-C while a demo closed). What the task raised is retrieved and
    logged at debug level, never raised: its owner is closing it.

    Returns:
        True when it ended by itself within ``timeout``.

    Raises:
        CancelledError: The caller was cancelled (the task was stopped first).
    """
    if task is None:
        return True
    try:
        if clock is None:
            await asyncio.wait([task], timeout=timeout)
        else:
            with contextlib.suppress(TimeoutError), clock.deadline(timeout):
                await asyncio.wait([task])
    except BaseException:
        await stop_task(task, clock=clock)
        raise
    if task.done():
        _retrieve(task)
        return True
    await stop_task(task, clock=clock)
    return False


async def stop_task(
    task: asyncio.Future[Any] | None,
    *,
    timeout: float = STOP_TIMEOUT,
    clock: Clock | None = None,
) -> bool:
    """Cancel ``task`` (one the caller owns) and wait at most ``timeout`` s for it to end.

    As :func:`stop_tasks` for one task (None: nothing to stop).
    """
    if task is None:
        return True
    return await stop_tasks([task], timeout=timeout, clock=clock)


async def stop_tasks(
    tasks: Iterable[asyncio.Future[Any]],
    *,
    timeout: float = STOP_TIMEOUT,
    clock: Clock | None = None,
) -> bool:
    """Cancel ``tasks`` (ones the caller owns), all at once, and wait at most ``timeout``
    seconds for them to end.

    Never ``task.cancel()`` then ``with suppress(CancelledError): await task``: that
    swallows the *caller's* cancellation when it arrives during the wait, and waits for
    ever on a task that swallows its own. Here the wait is ``asyncio.wait`` (which raises
    only the caller's cancellation, never the task's), bounded; a task still running at
    the bound is logged and left behind.

    Args:
        tasks: The tasks to stop (the calling task itself, if among them, is skipped).
        timeout: Most seconds to wait for them to end.
        clock: Measures the wait (virtual time in tests); None: the event loop's time.

    Returns:
        True when every task ended within ``timeout``.

    Raises:
        CancelledError: The caller itself is being cancelled (also when that cancellation
            arrived before this call and was swallowed on the way): it is never absorbed
            here. The tasks were cancelled all the same.
    """
    current = asyncio.current_task()
    pending: set[asyncio.Future[Any]] = set()
    for task in tasks:
        if task.done():
            _retrieve(task)
        elif task is not current:
            pending.add(task)
    for task in pending:
        task.cancel()
        task.add_done_callback(_retrieve)
    if pending:
        if clock is None:
            await asyncio.wait(pending, timeout=timeout)
        else:
            with contextlib.suppress(TimeoutError), clock.deadline(timeout):
                await asyncio.wait(pending)
    stuck = sorted(
        (task.get_name() if isinstance(task, asyncio.Task) else repr(task))
        for task in pending
        if not task.done()
    )
    if stuck:
        _log.warning(
            "%s did not end within %g s of being cancelled; gave up waiting for %s",
            ", ".join(stuck),
            timeout,
            "it" if len(stuck) == 1 else "them",
        )
    if current is not None and current.cancelling():
        raise asyncio.CancelledError
    return not stuck


async def run_owned(tasks: Sequence[asyncio.Task[Any]], *, clock: Clock | None = None) -> None:
    """Wait until every one of ``tasks`` (ones the caller owns) ended.

    Unlike ``asyncio.gather``, which leaves the others running when one fails, the first
    failure, or the caller's cancellation, stops the others (:func:`stop_tasks`) before it
    is raised.

    Raises:
        Exception: The first failure of a task.
        CancelledError: The caller was cancelled (the tasks were stopped first).
    """
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and (error := task.exception()) is not None:
                raise error
    except BaseException:
        await stop_tasks(tasks, clock=clock)
        raise


class InFlight:
    """The calls an object has under way, so that closing it lets them finish (bounded)
    and a call the close cut short says so.

    A call that fails because the object closed under it raises :class:`ClosedError` (a
    ``ValueError``, as the SDK's handler raises once shut down) rather than what its
    regions said of their closed connections ("the handler has already been shutdown",
    read as an outage or a wrong request).
    """

    def __init__(self, closed: Callable[[], bool], what: str) -> None:
        self._closed = closed
        self._what = what
        self._count = 0
        self._landed: asyncio.Event | None = None

    async def track(self, call: Awaitable[_T]) -> _T:
        """Await ``call`` as one of the calls in flight."""
        self._count += 1
        try:
            return await call
        except (RegionError, AllRegionsUnavailableError) as exc:
            if self._closed():
                raise ClosedError(
                    f"{self._what} was closed while this call was under way (what it had "
                    "sent by then may have reached a region); use a new one"
                ) from exc
            raise
        finally:
            self._count -= 1
            if not self._count and self._landed is not None:
                self._landed.set()

    async def landed(self, *, timeout: float, clock: Clock) -> None:
        """Wait up to ``timeout`` for the calls in flight to end."""
        if not self._count:
            return
        self._landed = asyncio.Event()
        with contextlib.suppress(TimeoutError), clock.deadline(timeout):
            await self._landed.wait()
        if self._count:
            _log.warning(
                "%s closed with %d call(s) still under way after %.1f s",
                self._what,
                self._count,
                timeout,
            )


async def close_in_order(
    steps: Iterable[tuple[str, Callable[[], Awaitable[object]] | None]],
) -> None:
    """Run close ``steps`` one after the other, each whatever the ones before it did.

    A step that raises is logged (by type only: an SDK error may carry an endpoint) and
    the next one runs; a cancellation of the caller is re-raised once every step ran.

    Args:
        steps: ``(what, step)`` pairs: ``what`` names the step in the log
            (``"stopping the pinger"``), ``step()`` does it (None: nothing to do).
    """
    cancelled: asyncio.CancelledError | None = None
    for what, step in steps:
        if step is None:
            continue
        try:
            await step()
        # cancellation: raised again once every step ran
        except asyncio.CancelledError as exc:
            cancelled = exc
        except Exception as exc:
            _log.warning("%s failed: %s", what, type(exc).__name__)
    if cancelled is not None:
        raise cancelled


async def close_all(
    resources: Iterable[_Closeable], *, timeout: float, clock: Clock, what: str = "client"
) -> None:
    """Close ``resources`` concurrently within ``timeout`` seconds in all. Never raises.

    A failure is logged by type only (an SDK error may carry an endpoint). A close still
    running at the deadline is cancelled and logged: one stuck client must not keep the
    caller's ``aclose`` from returning.
    """

    async def close(resource: _Closeable) -> None:
        try:
            await resource.close()
        except Exception as exc:
            _log.warning("closing a %s failed: %s", what, type(exc).__name__)

    tasks: list[asyncio.Future[Any]] = [
        asyncio.create_task(close(r), name=f"georep-close {what}") for r in resources
    ]
    if not tasks:
        return
    try:
        # asyncio.wait, not a shielded gather: a caller cancelled here leaves the closes
        # running all the same, and no gathering future is left holding an error nobody
        # retrieves (asyncio reports one at exit) when a stuck close is cancelled below.
        with clock.deadline(timeout):
            await asyncio.wait(tasks)
    except TimeoutError:
        stuck = [task for task in tasks if not task.done()]
        _log.warning(
            "%d %s(s) did not close within %g s; gave up on them", len(stuck), what, timeout
        )
        # Bounded too: a close that swallows its cancellation must not hang the caller.
        await stop_tasks(stuck, clock=clock)
