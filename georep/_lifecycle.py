"""The lifecycle every public async georep object shares.

``async with`` opens and closes; :meth:`AsyncResource.aclose` is idempotent and shielded (a
caller cancelled mid-close does not leave owned connections open); ``close()`` is the SDK's
name for it. A subclass writes only what is its own: :meth:`~AsyncResource._open` and
:meth:`~AsyncResource._close`. :func:`close_all` closes what an object created, concurrently
and bounded, so one stuck client never keeps the others open.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import Any, Protocol, Self

from georep import _fork
from georep.exceptions import ClosedError
from georep.ports import Clock

_log = logging.getLogger("georep")


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

    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(close(r)) for r in resources]
    if not tasks:
        return
    try:
        with clock.deadline(timeout):
            await asyncio.shield(asyncio.gather(*tasks))
    except TimeoutError:
        stuck = [task for task in tasks if not task.done()]
        for task in stuck:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        _log.warning(
            "%d %s(s) did not close within %g s; gave up on them", len(stuck), what, timeout
        )
