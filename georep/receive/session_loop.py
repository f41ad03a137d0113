"""Session mode of a GeoReceiver: hold sessions in both regions, hand messages on in order.

One :class:`SessionRegionLoop` per region accepts sessions (next available, up to
``max_sessions`` at once, plus those the other region asks for by name) and runs one worker
per held session. A worker takes its session's messages one at a time, in the order the
broker delivers them, and before handing a message on waits at the **order gate**: the
message's predecessor (the ``georep.order.prev`` key its sender stamped, see
:mod:`georep.send.ordering`) must have its final outcome, in either region. The gate opens
when:

1. the predecessor's key is final: processed here, or found final in the seen-set (it was
   processed from the other region, or by another consumer);
2. or the other region is known to hold none of it: this process holds the session there
   and found it empty after the message began waiting, or what it holds of the session
   comes after the predecessor, and browsing the session in both regions does not find
   it (gap ``absent``; found behind the message in its own region, the worker receives
   further into the session until it has it, and hands it on first);
3. or ``order_wait`` ran out (gap ``timeout``).

Meanwhile, while no consumer is on the predecessor, the worker also browses its own region
every few seconds, whatever the other region holds: a predecessor found there behind the
message (stored late, or handed back while its successors were handed over) is received
further into the session and handed on first, not waited for until ``order_wait`` runs out.

Cases 2 and 3 are visible: a warning, ``georep.sessions.order_gaps`` and the ledger's
``order_gap`` column. Each message then goes through the region loop's usual
claim → process → commit → settle (so the seen-set still suppresses the twin copy), one at
a time: handlers of one session never run concurrently.
"""

from __future__ import annotations

__all__ = ["FinishedKeys", "SessionPolicy", "SessionRegionLoop"]

import asyncio
import dataclasses
import enum
import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from georep._channel import bounded_call
from georep._lifecycle import start_task
from georep.exceptions import RegionError, StoreUnavailableError
from georep.ports import (
    FINAL_STATES,
    ClaimState,
    OrderStamp,
    RegionSessions,
    SessionReceiver,
)
from georep.receive.region_loop import RECEIVE_GRACE, Handler, LoopPolicy, RegionLoop
from georep.receive.settlement import Copy

if TYPE_CHECKING:
    from georep.receive.context import ReceiveContext

_log = logging.getLogger("georep.receiver")

_MAX_PROBES: Final = 4
"""Named accepts of the other region's sessions running at once, per region."""
_CLOSE_SECONDS: Final = 5.0
_UNKNOWN: Final = "unknown"
_KEEPER_TICK: Final = 1.0
"""Seconds between a session lock keeper's looks at the lock it keeps, at most."""
_KEEPER_IDLE: Final = 0.5
"""Seconds a session lock keeper waits when there is nothing to keep, or a renewal
failed."""
_OWN_LOOK: Final = 2.0
"""Seconds between browses of its own region for the predecessor a session's head waits
for, while whether the other region holds it is unknown."""
_READ_AHEAD: Final = 256
"""Copies a session worker holds in hand at most while it receives ahead for a
predecessor stored behind its successor (as many as browsing for one looks at)."""


class _Verdict(enum.Enum):
    """The order gate's answer for the copy at the head of a session's hand."""

    GO = "go"
    AGAIN = "again"
    STOP = "stop"


def _predecessors_first(hand: list[Copy]) -> None:
    """Move copies of ``hand`` before their successors: while the head's predecessor
    (its stamp's ``prev``) is further in hand, that predecessor becomes the head (a chain
    the outbox stored late comes out whole, in order; a cyclic stamp cannot loop)."""
    for _ in range(len(hand)):
        stamp = hand[0].delivery.stamp
        if stamp is None or stamp.prev is None:
            return
        index = next((i for i in range(1, len(hand)) if hand[i].delivery.key == stamp.prev), None)
        if index is None:
            return
        hand.insert(0, hand.pop(index))


@dataclass(frozen=True, slots=True)
class SessionPolicy(LoopPolicy):
    """The settings both regions' session loops share (validated by the GeoReceiver): the
    region loops' settings, and these.

    Attributes:
        max_sessions: Sessions accepted as next-available at once, per region.
        order_wait: Seconds a message waits for its predecessor before order is given up.
        session_idle: Seconds a session stays held without messages before it is released.
    """

    max_sessions: int
    order_wait: float
    session_idle: float

    @property
    def batch(self) -> int:
        """Messages received from a session per call (``concurrency``)."""
        return self.concurrency


class FinishedKeys:
    """Seen-set keys whose final outcome this GeoReceiver saw (both regions), the most
    recent ``limit`` kept: the order gate's answer without a round trip."""

    def __init__(self, limit: int = 100_000) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self._limit:
            self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


@dataclass(slots=True)
class _Held:
    """One session a region loop holds."""

    session: SessionReceiver
    hand: list[Copy] = field(default_factory=list)
    """Received, not yet taken to an outcome, in delivery order."""
    empty_at: float | None = None
    """When the session was last found empty (nothing in hand, a receive and a browse
    found nothing), monotonic seconds; None once something was received since."""
    last_final: Copy | None = None
    loop: RegionLoop | None = None
    """The region loop working on it (set once its worker starts)."""

    def holds_none_of(self, prev_key: str, writer: str, prev_seq: int, since: float) -> bool:
        """True when this session (in this region) surely does not hold ``prev_key``:
        nothing in hand and found empty at or after ``since`` (an emptiness seen before
        then is stale: the predecessor may have arrived after it, its receive not yet
        returned), or what is in hand of that writer comes after it (the broker delivers
        a session in order, so anything not in hand comes after the hand)."""
        if not self.hand:
            return self.empty_at is not None and self.empty_at >= since
        later = False
        for copy in self.hand:
            if copy.delivery.key == prev_key:
                return False
            stamp = copy.delivery.stamp
            if stamp is not None and stamp.writer == writer and stamp.seq > prev_seq:
                later = True
        return later


class SessionRegionLoop:
    """The session receive loop of one region.

    Args:
        sessions: The region's session entity.
        make_loop: Builds the region loop that processes one held session's copies (its
            settler told of each final settlement through the callback given).
        finished: The final keys both regions' loops saw.
        context: The GeoReceiver's shared state (seen-set, stats, metrics, clock, and the
            event set when it closes).
        policy: The session settings.
    """

    def __init__(
        self,
        sessions: RegionSessions,
        *,
        make_loop: Callable[[SessionReceiver, Callable[[Copy], None]], RegionLoop],
        finished: FinishedKeys,
        context: ReceiveContext,
        policy: SessionPolicy,
    ) -> None:
        self.sessions = sessions
        self.other: SessionRegionLoop | None = None
        """The other region's loop (set by the GeoReceiver once both exist)."""
        self._make_loop = make_loop
        self._seen = context.seen
        self._finished = finished
        self._stats = context.stats
        self._metrics = context.metrics
        self._clock = context.clock
        self._policy = policy
        self._stopping = context.stopping
        self._held: dict[str, _Held] = {}
        self._probing: set[str] = set()
        self._probe_after: dict[str, float] = {}
        self._quiet = False
        """The last accept found no free session, or failed: one slot asks at a time."""
        self._asking = 0
        self._found = asyncio.Event()
        self._empty_at: dict[str, float] = {}
        """When a receive last found a session empty here (monotonic seconds)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._handler: Handler | None = None

    @property
    def region(self) -> str:
        return self.sessions.region

    @property
    def held(self) -> frozenset[str]:
        """The session ids this region holds now."""
        return frozenset(self._held)

    # ------------------------------------------------------------------ the loop

    async def run(self, handler: Handler) -> None:
        """Accept sessions and work on them until the GeoReceiver stops.

        ``max_sessions`` slots, each accepting the next available session and working on it
        until it is released: accepting costs the SDK a link (and connection) of its own,
        about half a second, so the slots accept concurrently.
        """
        self._handler = handler
        try:
            await asyncio.gather(*(self._slot() for _ in range(self._policy.max_sessions)))
        finally:
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _slot(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            if self._quiet and self._asking:
                # The region had no free session (or did not answer) a moment ago and
                # another slot is asking already: wait for it to find one rather than open
                # one more link (an accept costs the SDK a connection of its own).
                await self._pause(2 * self._policy.max_wait, until=self._found)
                continue
            self._asking += 1
            try:
                session = await self._accept(None)
            except RegionError as exc:
                if failures == 0:
                    _log.warning("accepting a session in %s failed: %s", self.region, exc)
                self._quiet = True
                await self._pause(min(0.1 * 2**failures, 1.0))
                failures += 1
                continue
            finally:
                self._asking -= 1
            failures = 0
            if session is None:
                self._quiet = True
                continue
            self._quiet = False
            self._found.set()  # wake the waiting slots: there may be more
            self._found = asyncio.Event()
            held = self._hold(session)
            if held is not None:
                await self._work(held)

    async def _pause(self, seconds: float, *, until: asyncio.Event | None = None) -> None:
        """Wait ``seconds`` (or for ``until``), returning early when the receiver stops."""
        waits = [
            asyncio.ensure_future(self._stopping.wait()),
            asyncio.ensure_future(self._clock.sleep(seconds)),
        ]
        if until is not None:
            waits.append(asyncio.ensure_future(until.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _accept(self, session_id: str | None) -> SessionReceiver | None:
        label, max_wait = self.region, self._policy.max_wait
        with bounded_call(self._clock, label, "accepting a session", max_wait + RECEIVE_GRACE):
            return await self.sessions.accept(session_id, max_wait=max_wait)

    def _hold(self, session: SessionReceiver) -> _Held | None:
        """Record ``session`` as held here; None (and the session closed) when it already
        is (a named accept raced a next-available one)."""
        session_id = session.session_id
        if session_id in self._held:
            self._spawn(self._close_session(session), "close")
            return None
        held = _Held(session)
        self._held[session_id] = held
        return held

    def _spawn(self, coroutine: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``coroutine`` as a task of this loop: :meth:`run` waits for it before it
        returns (and cancels it with itself); a crash is logged when it happens."""
        task = start_task(coroutine, name=f"georep-session {what} {self.region}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ one session

    async def _work(self, held: _Held) -> None:
        """Work on one held session until it idles out, is lost, or the receiver stops."""
        session, handler = held.session, self._handler
        assert handler is not None

        def on_final(copy: Copy) -> None:
            held.last_final = copy
            if copy.delivery.key is not None:
                self._finished.add(self._policy.scope_prefix + copy.delivery.key)

        loop = held.loop = self._make_loop(session, on_final)
        idle_since = self._clock.monotonic()
        keeper = start_task(
            self._keep_locked(held, loop),
            name=f"georep-session-lock {self.region} {session.session_id}",
        )
        try:
            while not self._stopping.is_set():
                if not held.hand:
                    copies = await self._receive(loop, self._policy.batch)
                    if copies is None:
                        return
                    if not copies:
                        if not await self._surely_empty(session):
                            continue  # an empty answer from a slow broker, not an empty session
                        held.empty_at = self._found_empty(session.session_id)
                        if self._clock.monotonic() - idle_since >= self._policy.session_idle:
                            return
                        continue
                    held.empty_at = None
                    held.hand.extend(copies)
                _predecessors_first(held.hand)
                copy = held.hand[0]
                verdict = await self._gate(held, loop, copy)
                if verdict is _Verdict.STOP:
                    return
                if verdict is _Verdict.AGAIN:
                    continue
                if not await loop.process_copy(handler, copy):
                    return
                held.hand.pop(0)
                idle_since = self._clock.monotonic()
                if held.last_final is not copy and not await self._fetch_back(held, loop, copy):
                    return
        finally:
            keeper.cancel()
            # Bounded; asyncio.wait never raises the caller's own cancellation, which goes on
            # after the session is let go (stop_task would re-raise it before that).
            await asyncio.wait([keeper], timeout=_CLOSE_SECONDS)
            del self._held[session.session_id]
            await self._close_session(session)

    async def _keep_locked(self, held: _Held, loop: RegionLoop) -> None:
        """For as long as the session is held: keep its lock while copies are in hand.

        The worker's own calls (a browse of either region, a receive ahead, the seen-set)
        can each take up to :data:`~georep._channel.CALL_SECONDS`, as long as a short
        session lock lasts; renewing only between them let the lock of a session whose
        head waited for its predecessor lapse on a loaded machine or while the other region
        was blackholed (the session was lost, its copies redelivered, order waited again).
        So the lock is kept here, on its own schedule: renewed once less than half of it is
        left (as the SDK's AutoLockRenewer does), whatever the worker is waiting for.
        """
        while True:
            head = next(
                (c for c in held.hand if not c.settled and c.delivery.locked_until is not None),
                None,
            )
            if head is None:
                await self._clock.sleep(_KEEPER_IDLE)
                continue
            assert head.delivery.locked_until is not None
            now = self._clock.time()
            span = max(head.delivery.locked_until - head.renewed_at, _KEEPER_IDLE)
            left = head.delivery.locked_until - now
            if left > span / 2:
                await self._clock.sleep(min(left - span / 2, _KEEPER_TICK))
                continue
            if not await loop.renew_session_lock(head):
                if head.delivery.locked_until <= self._clock.time():
                    return  # lost: the worker finds out on its next call and lets it go
                await self._clock.sleep(_KEEPER_IDLE)  # the region did not answer: again
                continue
            for other in held.hand:  # one lock for the whole session
                if other is not head and not other.settled:
                    other.delivery = dataclasses.replace(
                        other.delivery, locked_until=head.delivery.locked_until
                    )
                    other.renewed_at = head.renewed_at

    async def _receive(self, loop: RegionLoop, room: int) -> list[Copy] | None:
        try:
            return await loop.receive_copies(room)
        except RegionError as exc:
            _log.warning("receiving from a session in %s failed: %s", self.region, exc)
            return None

    async def _fetch_back(self, held: _Held, loop: RegionLoop, copy: Copy) -> bool:
        """After a copy did not reach a final settlement (abandoned, or its settlement
        failed): the broker puts an abandoned copy back at the head of its session, before
        the copies still in hand; receive it again before going on.

        Returns:
            False when it did not come back (its abandon failed and it stays locked, or the
            broker is slow): the caller then releases the session, so that the broker hands
            everything unsettled out again in order. Going on with the copies in hand would
            hand the copy's successors on before it.
        """
        for _ in range(3):
            again = await self._receive(loop, 1)
            if again is None:
                return False
            for fresh in again:
                if fresh.delivery.key == copy.delivery.key:
                    held.hand.insert(0, fresh)
                    return True
                held.hand.append(fresh)
        _log.info(
            "session %s in %s: %s did not come back after it was handed back; releasing the "
            "session to receive it again in order",
            held.session.session_id,
            self.region,
            copy.delivery.key,
        )
        return False

    async def _close_session(self, session: SessionReceiver) -> None:
        try:
            with self._clock.deadline(_CLOSE_SECONDS):
                await session.close()
        except Exception as exc:  # TimeoutError included: given up on
            _log.debug("closing a session in %s failed: %r", self.region, exc)

    # --------------------------------------------------------------- the gate

    async def _gate(self, held: _Held, loop: RegionLoop, copy: Copy) -> _Verdict:
        """Wait until ``copy`` may be handed on (see the module's docstring).

        Returns:
            GO to hand it on; AGAIN when its predecessor is now in hand, behind it (to be
            handed on first); STOP when the receiver is stopping or the session failed
            (the copy is left to the session's close).
        """
        stamp = copy.delivery.stamp
        if stamp is None or stamp.prev is None:
            return _Verdict.GO
        prev_key = self._policy.scope_prefix + stamp.prev
        if prev_key in self._finished:
            return _Verdict.GO
        started = self._clock.monotonic()
        next_look = started  # when to browse this region for the predecessor next
        delay = 0.05
        while True:
            if self._stopping.is_set():
                return _Verdict.STOP
            state = await self._state(prev_key)
            if state in FINAL_STATES:
                self._finished.add(prev_key)
                break
            waited = self._clock.monotonic() - started
            # Nobody is on the predecessor (or the seen-set does not say): it may be behind
            # this copy in this very region, which is looked at whatever the other region
            # holds (it cannot be taken for absent until that is known, though).
            absent_elsewhere = state is None and self._absent_elsewhere(
                held, stamp.prev, stamp, started
            )
            now = self._clock.monotonic()
            if (state is None or state == _UNKNOWN) and (absent_elsewhere or now >= next_look):
                next_look = now + _OWN_LOOK
                if await loop.may_hold(stamp.prev):
                    # Behind it in this very region: stored after it (the durable outbox
                    # sent it late), handed back (released) while its successors were
                    # handed over, or still locked by a receiver that lost the session.
                    # The broker hands a session out in sequence order, and releasing the
                    # session would count a delivery of every copy in hand until the broker
                    # dead-letters them: receive further instead, to hand it on first.
                    found = await self._read_ahead(held, loop, copy)
                    if found is not None:
                        return _Verdict.AGAIN if found else _Verdict.STOP
                elif absent_elsewhere and not await self._other_may_hold(held, stamp.prev):
                    self._gap(copy, "absent", waited)
                    break
            if waited >= self._policy.order_wait:
                self._gap(copy, "timeout", waited)
                break
            # The session's lock is kept meanwhile by its keeper (:meth:`_keep_locked`).
            await self._clock.sleep(min(delay, max(self._policy.order_wait - waited, 0.0)))
            delay = min(delay * 2, 0.5)
        waited = self._clock.monotonic() - started
        copy.order_waited = waited
        self._stats.order_waited += waited
        self._metrics.order_wait(waited, self.region)
        return _Verdict.GO

    async def _read_ahead(self, held: _Held, loop: RegionLoop, copy: Copy) -> bool | None:
        """Receive more of ``copy``'s session into the hand, behind it, while its
        predecessor is found behind it in this region (at most :data:`_READ_AHEAD` copies
        in hand: beyond, it waits as for a predecessor nowhere to be found).

        Returns:
            True when the predecessor is now in hand; False when the receive failed (the
            session is to be released); None when it is not in hand yet (keep waiting:
            locked by a receiver that lost the session, it returns when that lock ends).
        """
        if len(held.hand) >= _READ_AHEAD:
            return None
        copies = await self._receive(loop, min(self._policy.batch, _READ_AHEAD - len(held.hand)))
        if copies is None:
            return False
        held.hand.extend(copies)
        stamp = copy.delivery.stamp
        prev = None if stamp is None else stamp.prev
        if not any(c.delivery.key == prev for c in copies):
            return None
        _log.info(
            "session %s in %s: %s waited for %s, received behind it; handing that on first",
            held.session.session_id,
            self.region,
            copy.delivery.key,
            prev,
        )
        return True

    async def _state(self, key: str) -> ClaimState | str | None:
        try:
            return (await self._seen.peek([key]))[0]
        except StoreUnavailableError:
            self._stats.store_errors += 1
            self._metrics.store_error()
            return _UNKNOWN

    async def _other_may_hold(self, held: _Held, prev: str) -> bool:
        """Whether browsing the other region's session (when this process holds it there)
        finds ``prev``: its hand and emptiness say nothing of a copy locked by a receiver
        that lost the session."""
        other = self.other
        theirs = None if other is None else other._held.get(held.session.session_id)
        return theirs is not None and theirs.loop is not None and await theirs.loop.may_hold(prev)

    def _absent_elsewhere(self, held: _Held, prev: str, stamp: OrderStamp, since: float) -> bool:
        """True when the other region is known to hold none of the predecessor now."""
        other = self.other
        if other is None:
            return False
        return other.holds_none_of(
            held.session.session_id, prev, stamp.writer, stamp.seq - 1, since=since
        )

    def holds_none_of(
        self, session_id: str, prev: str, writer: str, prev_seq: int, *, since: float
    ) -> bool:
        """Whether this region surely holds no copy of ``prev`` in ``session_id`` now.

        ``since`` is when the successor started waiting: it was stored before then, so its
        predecessor was too, and a session found empty after it holds no predecessor (one
        processed meanwhile is final in the seen-set; one locked by another consumer keeps
        the session from being accepted). If the session is not held here and was not found
        empty since, ask for it by name (in the background, a few at a time); until then
        the answer is False (unknown).
        """
        held = self._held.get(session_id)
        if held is not None:
            return held.holds_none_of(prev, writer, prev_seq, since)
        if self._empty_at.get(session_id, -1.0) >= since:
            return True
        self._probe(session_id)
        return False

    async def _surely_empty(self, session: SessionReceiver) -> bool:
        """An empty receive says the session is empty only if browsing it agrees: under load
        a receive can time out before the broker hands over what the session holds, and
        taking that for "holds none" would hand a successor on without its predecessor."""
        try:
            with bounded_call(self._clock, self.region, "a browse"):
                return not await session.has_messages()
        except RegionError:
            return False  # unknown: not empty

    def _found_empty(self, session_id: str) -> float:
        """Record that ``session_id`` was found empty now; returns now."""
        if len(self._empty_at) >= 10_000:  # only recent answers matter: keep the map small
            self._empty_at.clear()
        now = self._empty_at[session_id] = self._clock.monotonic()
        return now

    def _probe(self, session_id: str) -> None:
        if (
            session_id in self._probing
            or len(self._probing) >= _MAX_PROBES
            or self._stopping.is_set()
            or self._handler is None
            or self._clock.monotonic() < self._probe_after.get(session_id, 0.0)
        ):
            return
        self._probing.add(session_id)
        self._spawn(self._accept_named(session_id), f"accept {session_id}")

    async def _accept_named(self, session_id: str) -> None:
        session: SessionReceiver | None = None
        try:
            session = await self._accept(session_id)
        except RegionError as exc:
            _log.debug("accepting session %s in %s failed: %s", session_id, self.region, exc)
        finally:
            self._probing.discard(session_id)
        if session is None:  # locked by another receiver, or the region is down
            self._probe_after[session_id] = self._clock.monotonic() + max(
                self._policy.max_wait, 1.0
            )
            return
        self._probe_after.pop(session_id, None)
        if self._stopping.is_set():
            await self._close_session(session)
            return
        held = self._hold(session)
        if held is not None:
            await self._work(held)

    def _gap(self, copy: Copy, reason: str, waited: float) -> None:
        copy.order_gap = reason
        self._stats.order_gaps += 1
        self._metrics.order_gap(self.region, reason)
        stamp = copy.delivery.stamp
        _log.warning(
            "session %s: handing on %s (seq %s) from %s without its predecessor %s after "
            "%.1f s: %s",
            copy.delivery.session_id,
            copy.delivery.key,
            None if stamp is None else stamp.seq,
            self.region,
            None if stamp is None else stamp.prev,
            waited,
            "order_wait ran out" if reason == "timeout" else "no region holds it",
        )
