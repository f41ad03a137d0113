"""An in-memory session-enabled queue: :class:`georep.ports.RegionSessions` on a FakeClock."""

from __future__ import annotations

__all__ = ["InMemoryRegionSessions", "InMemorySessionReceiver"]

import asyncio
import dataclasses
import itertools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from georep._region_identity import RegionLabels
from georep.exceptions import RegionError, region_error
from georep.ports import Delivery, ErrorKind
from georep.send.ordering import read_stamp
from georep.testing._clock import FakeClock
from georep.testing._faults import FaultSwitch
from georep.testing._messages import FakeMessage
from georep.testing._regions import FakeLabels, FakeReceivedMessage, dedup_value


@dataclass
class _Session:
    available: list[FakeReceivedMessage] = field(default_factory=list)
    locked: dict[int, FakeReceivedMessage] = field(default_factory=dict)
    holder: InMemorySessionReceiver | None = None
    locked_until: float = 0.0
    state: bytes | None = None
    stranded: list[FakeReceivedMessage] = field(default_factory=list)
    """Locked by a holder that lost the session (see ``strand``), until ``stranded_until``."""
    stranded_until: float = 0.0


class InMemoryRegionSessions(FaultSwitch, FakeLabels):
    """One fake region's session-enabled queue, as Service Bus behaves (docs/emulator.md).

    Messages of a session are delivered in order to the one receiver holding the session;
    a session's lock lasts ``lock_duration`` unless renewed, and closing its receiver (or
    the lock expiring) releases it, its unsettled messages back at its head, delivery count
    + 1. ``fail_with``/``hang``/``restore`` make every call of the region fail, as an
    outage would (a receiver holding a session then loses it on its next call).

    Attributes:
        completed: Copies completed, in order, across sessions.
        accepts: Sessions accepted (session id per accept), in order.
        slow_receives: The next this many receives wait their ``max_wait`` and return
            nothing although the session holds messages (a broker slow to deliver, as
            under load); browsing still sees them.
        unanswered_browses: The next this many browses of a session (``has_messages``,
            ``peek``) never return, as on a link an outage broke (the caller's deadline
            ends them).
        unanswered_abandons: The next this many abandons fail (the broker did not answer
            in time) and leave their message locked in its session until the session is
            released.
    """

    def __init__(
        self,
        region: str,
        namespace: str | None = None,
        entity: str = "orders",
        *,
        lock_duration: float = 30.0,
        clock: FakeClock,
    ) -> None:
        FaultSwitch.__init__(self, region)
        FakeLabels.__init__(self, region, namespace, entity)
        self._clock = clock
        self.lock_duration = lock_duration
        self._sessions: dict[str, _Session] = {}
        self._sequence = itertools.count(1)
        self._tokens = itertools.count(1)
        self.completed: list[FakeReceivedMessage] = []
        self.accepts: list[str] = []
        self.slow_receives = 0
        self.unanswered_abandons = 0
        self.unanswered_browses = 0
        self.closed = False

    def put(self, message: FakeMessage) -> None:
        """Enqueue a copy of ``message`` in its session (``message.session_id`` required)."""
        if message.session_id is None:
            raise ValueError("a session queue takes only messages with a session_id")
        session = self._sessions.setdefault(message.session_id, _Session())
        session.available.append(
            FakeReceivedMessage.stored(message, next(self._sequence), session_id=message.session_id)
        )

    def pending(self, session_id: str | None = None) -> int:
        """Messages not yet settled (in one session, or in all)."""
        chosen = self._sessions.values() if session_id is None else [self._sessions[session_id]]
        return sum(len(s.available) + len(s.locked) for s in chosen)

    def strand(self, session_id: str) -> None:
        """The holder of ``session_id`` loses it, but what it received stays locked until
        its lock would have expired (a broker that has not yet noticed the holder's link
        is gone): meanwhile the next holder receives only what comes after."""
        session = self._sessions[session_id]
        if session.holder is not None:
            session.holder.lost = True
        session.holder = None
        session.stranded.extend(session.locked.values())
        session.stranded_until = session.locked_until
        session.locked.clear()

    def _expire(self) -> None:
        now = self._clock.time()
        for session in self._sessions.values():
            if session.holder is not None and session.locked_until <= now:
                self._release(session)
            if session.stranded and session.stranded_until <= now:
                for message in session.stranded:
                    message.delivery_count += 1
                session.available.extend(session.stranded)
                session.available.sort(key=lambda m: m.sequence_number)
                session.stranded.clear()

    def _release(self, session: _Session) -> None:
        for message in session.locked.values():
            message.delivery_count += 1
            session.available.append(message)
        session.locked.clear()
        session.available.sort(key=lambda m: m.sequence_number)
        if session.holder is not None:
            session.holder.lost = True
        session.holder = None

    async def accept(self, session_id: str | None, *, max_wait: float) -> Any:
        await self._injected_fault()
        self._expire()
        chosen = self._free(session_id)
        if chosen is None and session_id is None:
            await self._clock.sleep(max_wait)
            await self._injected_fault()
            self._expire()
            chosen = self._free(None)
        if chosen is None:
            return None
        name, session = chosen
        receiver = InMemorySessionReceiver(self, name, session)
        session.holder = receiver
        session.locked_until = self._clock.time() + self.lock_duration
        self.accepts.append(name)
        return receiver

    def _free(self, session_id: str | None) -> tuple[str, _Session] | None:
        if session_id is not None:
            session = self._sessions.setdefault(session_id, _Session())
            return None if session.holder is not None else (session_id, session)
        candidates = [
            (s.available[0].sequence_number, name, s)
            for name, s in self._sessions.items()
            if s.holder is None and s.available
        ]
        if not candidates:
            return None
        _, name, session = min(candidates, key=lambda c: c[0])
        return name, session

    async def list_sessions(
        self, *, state_updated_after: datetime | None = None, timeout: float | None = None
    ) -> list[str]:
        """The sessions holding messages, in the order they were first used. This fake
        keeps no session state: with ``state_updated_after`` it lists none."""
        await self._injected_fault()
        if state_updated_after is not None:
            return []
        return [name for name, s in self._sessions.items() if s.available or s.locked]

    async def close(self) -> None:
        self.closed = True


class InMemorySessionReceiver(RegionLabels):
    """One session locked in an :class:`InMemoryRegionSessions`.

    Attributes:
        lost: The session's lock expired or the region failed under it.
    """

    def __init__(self, queue: InMemoryRegionSessions, session_id: str, session: _Session) -> None:
        super().__init__(queue.region, queue.namespace, queue.entity)
        self._queue = queue
        self._session_id = session_id
        self._session = session
        self.lost = False

    @property
    def session_id(self) -> str:
        return self._session_id

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        properties = message.application_properties
        return Delivery(
            key=dedup_value(message, dedup_source, dedup_name),
            delivery_count=message.delivery_count,
            enqueued_at=None,
            locked_until=self._session.locked_until,
            traceparent=properties.get("traceparent"),
            session_id=self._session_id,
            stamp=read_stamp(properties.get),
        )

    async def _check(self) -> None:
        try:
            await self._queue._injected_fault()
        except RegionError:
            if self._session.holder is self:
                self._queue._release(self._session)
            raise
        self._queue._expire()
        if self.lost or self._session.holder is not self:
            self.lost = True
            raise region_error(
                f"{self.region}: session {self._session_id} lock lost",
                region=self.region,
                kind=ErrorKind.LOCK_LOST,
            )

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        await self._check()
        session = self._session
        if self._queue.slow_receives > 0:
            self._queue.slow_receives -= 1
            await self._queue._clock.sleep(max_wait)
            return []
        if not session.available:
            await self._queue._clock.sleep(max_wait)
            await self._check()
        batch, session.available = (
            session.available[:max_messages],
            session.available[max_messages:],
        )
        copies = []
        for message in batch:
            message.lock_token = next(self._queue._tokens)
            session.locked[message.lock_token] = message
            copies.append(dataclasses.replace(message))
        return copies

    async def _held(self, message: Any) -> FakeReceivedMessage:
        await self._check()
        held = self._session.locked.pop(message.lock_token, None)
        if held is None:
            raise region_error(
                f"{self.region}: unknown lock", region=self.region, kind=ErrorKind.LOCK_LOST
            )
        return held

    async def _browse(self) -> None:
        if self._queue.unanswered_browses > 0:
            self._queue.unanswered_browses -= 1
            await asyncio.Event().wait()  # no answer: only a cancellation ends it

    async def has_messages(self) -> bool:
        await self._browse()
        await self._check()
        return bool(self._session.available or self._session.locked or self._session.stranded)

    async def peek(self, count: int) -> list[Any]:
        await self._browse()
        stored = sorted(
            [*self._session.available, *self._session.locked.values(), *self._session.stranded],
            key=lambda m: m.sequence_number,
        )
        return [dataclasses.replace(m) for m in stored[:count]]

    async def complete(self, message: Any) -> None:
        self._queue.completed.append(await self._held(message))

    async def abandon(self, message: Any) -> None:
        if self._queue.unanswered_abandons > 0:
            await self._check()
            self._queue.unanswered_abandons -= 1
            raise region_error(
                f"{self.region}: abandoning did not return",
                region=self.region,
                kind=ErrorKind.TIMEOUT,
            )
        held = await self._held(message)
        held.delivery_count += 1
        self._session.available.insert(0, held)
        self._session.available.sort(key=lambda m: m.sequence_number)

    async def dead_letter(self, message: Any, reason: str | None, description: str | None) -> None:
        held = await self._held(message)
        held.dead_letter_reason = reason
        held.dead_letter_error_description = description

    async def defer(self, message: Any) -> None:
        await self._held(message)

    async def renew_lock(self, message: Any) -> float | None:
        await self._check()
        self._session.locked_until = self._queue._clock.time() + self._queue.lock_duration
        return self._session.locked_until

    async def get_state(self) -> bytes | None:
        await self._check()
        return self._session.state

    async def set_state(self, state: bytes | None) -> None:
        await self._check()
        self._session.state = state

    async def close(self) -> None:
        if self._session.holder is self:
            self._queue._release(self._session)
