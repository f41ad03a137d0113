"""What the parts of one GeoReceiver share: its counters and the context its loops run in.

The region loops, the session loops and the settlers each take the one
:class:`ReceiveContext` of their GeoReceiver; none of them imports :mod:`georep.receive.receiver`
(as :mod:`georep.send.result` is for the GeoSender's parts).
"""

from __future__ import annotations

__all__ = ["HeldHere", "ReceiveContext", "ReceiverStats", "RecentOutcomes"]

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace

from georep._telemetry import ReceiverMetrics
from georep.ports import ClaimState, Clock, Ledger, SeenStore
from georep.receive.outcomes import Decisions


@dataclass(slots=True)
class ReceiverStats:
    """Live counters of one GeoReceiver.

    Attributes:
        processed: Copies whose handler succeeded (each is one logical message).
        failed: Handler failures: it raised or abandoned the copy (abandoned for
            redelivery, or dead-lettered once ``max_attempts`` is reached).
        dead_lettered: Copies dead-lettered: by the handler, after ``max_attempts``, or
            as the twin of a copy dead-lettered in the other region.
        deferred: Copies deferred: by the handler, or as the twin of a deferred copy.
        suppressed: Duplicate copies settled without calling the handler, by region.
        pings: The paired namespaces' ping messages completed without the handler.
        unchecked: Copies processed without a dedup check (``on_store_unavailable="process"``
            or a copy without a dedup key).
        order_gaps: Session mode: messages handed on without their predecessor processed
            (``order_wait`` ran out, or no region held it).
        order_waited: Session mode: seconds messages spent waiting for their predecessors.
        received: Copies received, by region.
        parked: Copies now waiting for another consumer's outcome.
        in_flight: Handlers running now.
        store_errors: Seen-set calls that failed (Redis unreachable).
    """

    processed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    deferred: int = 0
    suppressed: dict[str, int] = field(default_factory=dict)
    pings: int = 0
    unchecked: int = 0
    order_gaps: int = 0
    order_waited: float = 0.0
    received: dict[str, int] = field(default_factory=dict)
    parked: int = 0
    in_flight: int = 0
    store_errors: int = 0


class RecentOutcomes:
    """The outcomes this GeoReceiver recorded in the seen-set itself, for a while.

    A message's twin in the other region is mostly received by this receiver's other
    region loop moments after the first copy was committed: its outcome is known here, and
    the twin is settled the same way without a claim round trip (one of the three a
    message otherwise costs). Only ``DONE`` and ``DEAD_LETTERED`` are kept: they stay
    final for the seen-set's window, while a deferred key is completed later.

    An entry lasts half the seen-set's ``window`` (at most ``max_age`` seconds, on the
    receiver's clock), well inside the time the store itself keeps the outcome; a store
    that does not say its window (no ``window`` attribute) gets no entries.

    Args:
        clock: Time source.
        window: The seen-set's window in seconds, or None if unknown.
        limit: Keys kept, the most recent.
        max_age: Seconds an entry lasts at most.
    """

    def __init__(
        self, clock: Clock, window: float | None, *, limit: int = 16_384, max_age: float = 300.0
    ) -> None:
        self._clock = clock
        self._ttl = 0.0 if window is None else min(window / 2, max_age)
        self._limit = limit
        self._entries: dict[str, tuple[float, ClaimState, str | None]] = {}

    def add(self, keys: Sequence[str], state: ClaimState, reasons: Sequence[str] | None) -> None:
        """``keys`` (seen-set keys) were just committed with outcome ``state``."""
        if self._ttl <= 0 or state not in (ClaimState.DONE, ClaimState.DEAD_LETTERED):
            return
        entries = self._entries
        until = self._clock.monotonic() + self._ttl
        for index, key in enumerate(keys):
            entries.pop(key, None)  # re-inserted last: the oldest stay first
            entries[key] = (until, state, None if reasons is None else reasons[index])
        while len(entries) > self._limit:
            del entries[next(iter(entries))]

    def get(self, key: str) -> tuple[ClaimState, str | None] | None:
        """The outcome recorded for seen-set key ``key`` (and its dead-letter reason), if
        known here."""
        entry = self._entries.get(key)
        if entry is None or entry[0] <= self._clock.monotonic():
            return None
        return entry[1], entry[2]

    def __bool__(self) -> bool:
        return bool(self._entries)


class HeldHere:
    """The keys one of this GeoReceiver's loops holds a claim on now, and which loop.

    A message's two copies reach the receiver's two region loops moments apart: the loop
    that claims second finds the key in flight and parks its copy until the first one's
    outcome is recorded. Asking the seen-set again and again for an outcome that this
    process will record itself cost three claims of a key per copy (a pull receiver
    completing one message at a time); a loop asks here first, and a copy whose key a
    sibling loop holds waits for the sibling to let it go (:meth:`release`), then takes
    the outcome from :class:`RecentOutcomes` or, failing that, from a claim.
    """

    def __init__(self) -> None:
        # key -> (the loop holding it, futures of copies waiting for it to let go)
        self._holders: dict[str, tuple[str, list[asyncio.Future[None]]]] = {}

    def hold(self, keys: Sequence[str], owner: str) -> None:
        """``owner`` (a loop) claimed ``keys`` (seen-set keys) and processes them now."""
        for key in keys:
            entry = self._holders.get(key)
            if entry is None or entry[0] != owner:
                self._holders[key] = (owner, [])

    def release(self, keys: Sequence[str], owner: str) -> None:
        """``owner`` let go of ``keys`` (recorded an outcome, released, or gave up): the
        copies waiting for them go on. Keys another loop holds are left alone."""
        for key in keys:
            entry = self._holders.get(key)
            if entry is not None and entry[0] == owner:
                del self._holders[key]
                for waiter in entry[1]:
                    if not waiter.done():
                        waiter.set_result(None)

    def elsewhere(self, key: str, owner: str) -> bool:
        """Whether a loop of this receiver other than ``owner`` holds ``key``."""
        entry = self._holders.get(key)
        return entry is not None and entry[0] != owner

    def wake(self, keys: Sequence[str], waiter: asyncio.Future[None]) -> None:
        """Resolve ``waiter`` once the first of ``keys`` is let go (at once if one is not
        held any more)."""
        for key in keys:
            entry = self._holders.get(key)
            if entry is None:
                if not waiter.done():
                    waiter.set_result(None)
                return
            waiters = entry[1]
            if waiters and waiters[0].done():  # those of earlier waits that timed out
                waiters[:] = [w for w in waiters if not w.done()]
            waiters.append(waiter)

    def __bool__(self) -> bool:
        return bool(self._holders)


@dataclass(frozen=True, slots=True)
class ReceiveContext:
    """One GeoReceiver's state, as its loops and settlers share it.

    Attributes:
        entity: The entity path the receiver reads (spans, ledger rows).
        seen: The shared seen-set.
        decisions: The handlers' decisions, recorded by the receiver's outcome methods.
        stats: The receiver's counters (updated in place).
        metrics: The receiver's metrics.
        ledger: Where a row per settled copy goes, if anywhere.
        clock: Time source.
        stopping: Set when the receiver closes.
        tracer: The receiver's tracer.
        tracing: Whether spans are recorded now.
        recent: The outcomes this receiver committed lately (twins settled without a claim).
        held_here: The keys this receiver's loops hold now (twins wait without a claim).
    """

    entity: str
    seen: SeenStore
    decisions: Decisions
    stats: ReceiverStats
    metrics: ReceiverMetrics
    ledger: Ledger | None
    clock: Clock
    stopping: asyncio.Event
    tracer: trace.Tracer
    tracing: Callable[[], bool]
    recent: RecentOutcomes
    held_here: HeldHere = field(default_factory=HeldHere)
