"""Which sessions have a message waiting in the outbox: a session's next sends queue behind it.

A message of session S that went to the outbox (both regions down) is delivered later, by
the drainer. A send of S straight to a region meanwhile would overtake it. So while the
outbox holds an entry of S, the sender queues S's new sends behind it, and the drainer
delivers a session's entries in order (:meth:`georep.ports.Outbox.claim`).

:class:`HeldSessions` is the sender's view: the sessions it may have in the outbox (those
it queued, and those the file held when it first looked, e.g. left by a process that was
killed), each confirmed against the outbox before a send is queued behind it. In the
common case (nothing queued) a send costs no outbox call at all.
"""

from __future__ import annotations

__all__ = ["HeldSessions"]

import asyncio
import contextlib
import logging
from collections.abc import Collection, Iterator

from georep._logs import Throttled
from georep.ports import Outbox

_log = logging.getLogger("georep.sender")
_troubles = Throttled(_log)


class HeldSessions:
    """The sessions of one sender's outbox channel that may have an entry queued.

    Args:
        outbox: The durable outbox.
        channel: The sender's channel in it.
    """

    __slots__ = (
        "_channel",
        "_in_flight",
        "_loaded",
        "_loading",
        "_outbox",
        "_version",
        "_versions",
    )

    def __init__(self, outbox: Outbox, channel: str) -> None:
        self._outbox = outbox
        self._channel = channel
        # session -> the version it was last marked at (versions only grow).
        self._versions: dict[str, int] = {}
        self._version = 0
        self._in_flight = 0
        self._loaded = False
        self._loading = asyncio.Lock()

    @contextlib.contextmanager
    def recording(self, sessions: Collection[str]) -> Iterator[None]:
        """Around a put of ``sessions``' messages: they count as held from before the put
        starts (a cancelled put may still have stored them), and no :meth:`forget` drops
        them while it runs."""
        self._mark(sessions)
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    def _mark(self, sessions: Collection[str]) -> None:
        for session in sessions:
            self._version += 1
            self._versions[session] = self._version

    async def held(self, sessions: Collection[str]) -> bool:
        """True when the outbox holds an entry of one of ``sessions`` (checked in the
        outbox whenever this sender may have put one there).

        An outbox that cannot be read now answers False (logged): the send goes to the
        regions, and the session's order is not kept behind what the outbox holds.
        """
        if not sessions:
            return False
        try:
            if not self._loaded:
                await self._load()
            maybe = [session for session in sessions if session in self._versions]
            if not maybe:
                return False
            seen = {session: self._versions[session] for session in maybe}
            still = await self._outbox.held_sessions(self._channel, maybe)
        except Exception as exc:  # CancelledError is not an Exception: never swallowed
            _troubles.warning(
                ("held-sessions", self._channel),
                "outbox %s: cannot tell whether it holds an earlier message of a session "
                "being sent (%s); sending to the regions, so that session's order is not "
                "kept behind what the outbox holds",
                self._channel,
                type(exc).__name__,
            )
            return False
        for session, version in seen.items():
            # Only if not marked again meanwhile (a put of ours may have started since).
            if session not in still and self._versions.get(session) == version:
                del self._versions[session]
        return bool(still)

    async def _load(self) -> None:
        """Learn, once, what the outbox held before this sender: a previous process's
        entries (killed, or closed with entries left) still go first."""
        async with self._loading:
            if self._loaded:
                return
            self._mark(await self._outbox.held_sessions(self._channel))
            self._loaded = True

    def checkpoint(self) -> int | None:
        """A version to pass to :meth:`forget` once the channel was seen empty after it;
        None while a put is in flight (then nothing may be forgotten)."""
        return None if self._in_flight else self._version

    def forget(self, checkpoint: int | None) -> None:
        """The channel was empty after ``checkpoint``: drop the sessions marked until then."""
        if checkpoint is None or self._in_flight:
            return
        self._versions = {s: v for s, v in self._versions.items() if v > checkpoint}

    def __len__(self) -> int:
        return len(self._versions)
