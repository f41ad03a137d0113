"""One region's receive loop of a GeoReceiver: receive, claim, process, settle, renew.

A GeoReceiver runs one :class:`RegionLoop` per region, and only that loop touches the
region's receiver (the SDK's receivers are not safe for concurrent calls). A turn:

1. receive up to ``concurrency`` copies (fewer while copies are parked);
2. claim their keys, and the keys of copies parked from earlier turns, in one round trip
   to the seen-set;
3. settle the copies found DONE (duplicates) at once;
4. run the handler on every CLAIMED copy, concurrently, and commit (or release) and settle
   each one as soon as it finishes, batched with whatever finished meanwhile, so a slow
   handler never holds back its turn-mates; a side task renews locks and leases while
   handlers run long;
5. copies whose key is IN_FLIGHT elsewhere stay locked ("parked") and are claimed again
   next turn.

A parked copy waits for the other holder's outcome without a busy loop: it rides along
with the next turn's claim, and the turn itself waits on the broker when idle.
"""

from __future__ import annotations

__all__ = ["RECEIVE_GRACE", "Handler", "LoopPolicy", "RegionLoop", "StorePolicy"]

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from opentelemetry.trace import Status, StatusCode

from georep._channel import bounded_call
from georep._lifecycle import start_task, stop_task
from georep._logs import Throttled
from georep._policy import DedupKey
from georep.exceptions import RegionError, StoreUnavailableError
from georep.ports import (
    ClaimState,
    Clock,
    RegionReceiver,
)
from georep.receive.dedup import first_of_each_key, sort_by_claim
from georep.receive.outcomes import (
    ABANDON,
    COMPLETE,
    LEDGER_OUTCOMES,
    Decision,
    Settle,
    max_attempts_decision,
)
from georep.receive.settlement import Copy, Settlements

if TYPE_CHECKING:
    from georep.receive.context import ReceiveContext

_log = logging.getLogger("georep.receiver")
_troubles = Throttled(_log)
"""Warnings that repeat while a region or the seen-set is down: one line, then one per 30 s
with the count held back (each at DEBUG)."""
_SEEN_SET_DOWN: Final = "seen-set unreachable"

RECEIVE_GRACE: Final = 10.0
"""Seconds a receive call may take beyond ``max_wait`` (opening a link, a slow answer)
before georep gives up on it: the SDK alone can wait forever on a lost link."""

Handler = Callable[[Any], Awaitable[object]]
StorePolicy = Literal["pause", "process"]
_T = TypeVar("_T")


SETTLE_LINGER: Final = 0.02
"""Seconds a region loop waits on for more outcomes before it settles those it has, while
copies of the same turn are still undecided: a puller decides one message at a time, and
what came within this window goes to the region in one call (one disposition for the
completions, not a round trip each). Only the region's settlement waits: the outcome is in
the seen-set already."""


@dataclass(frozen=True, slots=True)
class LoopPolicy:
    """The settings every region loop of one GeoReceiver shares (validated by it).

    Attributes:
        concurrency: Handlers running at once, and copies received per turn.
        lease: Seconds a claim lasts unless renewed.
        max_wait: Seconds one receive call waits for copies when the entity is idle.
        max_attempts: Handler failures after which a copy is dead-lettered.
        on_store_unavailable: ``"pause"`` or ``"process"`` (see GeoReceiver).
        dedup_key: The field that identifies a logical message.
        scope_prefix: Prepended to every dedup key to make its seen-set key.
    """

    concurrency: int
    lease: float
    max_wait: float
    max_attempts: int
    on_store_unavailable: StorePolicy
    dedup_key: DedupKey
    scope_prefix: str

    def keys(self, copies: Sequence[Copy]) -> list[str]:
        """The seen-set keys of ``copies`` (those with a dedup key), in this scope."""
        prefix = self.scope_prefix
        return [prefix + c.delivery.key for c in copies if c.delivery.key is not None]


async def _all_waiting(queue: asyncio.Queue[_T]) -> list[_T]:
    """The items in ``queue``: the first waited for, then every one already there."""
    items = [await queue.get()]
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


class _Stopping(Exception):
    """Closing while the seen-set is unreachable: the turn's copies are handed back."""


class _Backoff:
    """Exponential waits, 0.1 s doubling to 5 s, on the injected clock."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._attempts = 0

    def reset(self) -> None:
        self._attempts = 0

    async def wait(self, stopping: asyncio.Event | None) -> None:
        delay = min(0.1 * 2**self._attempts, 5.0)
        self._attempts += 1
        if stopping is not None and stopping.is_set():
            return
        await self._clock.sleep(delay)


class RegionLoop:
    """The receive loop of one region.

    Args:
        settlements: The region's settler; its ``region`` is the receiver this loop reads
            and its ``lock`` guards every call on it.
        owner: This loop's identity in the seen-set (one per region: the twin in the
            other region must not find "our" claim and process the message again).
        context: The GeoReceiver's shared state (seen-set, decisions, stats, metrics,
            clock, and the event set when it closes).
        policy: The shared settings.
    """

    def __init__(
        self, settlements: Settlements, *, owner: str, context: ReceiveContext, policy: LoopPolicy
    ) -> None:
        self.region: RegionReceiver = settlements.region
        self.owner = owner
        self._settlements = settlements
        self._seen = context.seen
        self._recent = context.recent
        self._held_here = context.held_here
        self._decisions = context.decisions
        self._stats = context.stats
        self._metrics = context.metrics
        self._clock = context.clock
        self._policy = policy
        self._stopping = context.stopping
        self._parked = 0

    # ------------------------------------------------------------------ the loop

    async def run(self, handler: Handler) -> None:
        """Receive and process until the GeoReceiver stops; parked copies are abandoned."""
        parked: list[Copy] = []
        backoff = _Backoff(self._clock)
        while True:
            if self._stopping.is_set():
                await self._abandon_all(parked)
                return
            room = self._policy.concurrency - len(parked)
            fresh: list[Copy] = []
            if room > 0:
                try:
                    fresh = await self._fresh(room)
                except RegionError as exc:
                    self._region_warning(
                        "receive", exc, "receive from %s failed: %s", self.region.region, exc
                    )
                    await backoff.wait(self._stopping)
                    continue
                backoff.reset()
            if not fresh and not parked:
                continue
            try:
                parked = await self._turn(handler, parked + fresh)
            except _Stopping:
                await self._abandon_all(parked + fresh)
                return
            self._set_parked(len(parked))

    async def receive_copies(self, room: int, max_wait: float | None = None) -> list[Copy]:
        """One bounded receive of up to ``room`` copies, pings completed (session workers).

        ``max_wait`` (default the policy's) is how long an empty region is waited for: the
        receive holds the region's lock, so a caller with settlements pending there waits
        less.

        Raises:
            RegionError: The region failed or did not answer in time.
        """
        return await self._fresh(room, max_wait)

    async def process_copy(self, handler: Handler, copy: Copy) -> bool:
        """Take one copy to its outcome: claim, handle (or settle as a twin), commit, settle;
        waiting while another consumer holds its key (session workers, one copy at a time).

        Returns:
            False when the receiver closed first and the copy was handed back (abandoned).
        """
        return await self.process_copies(handler, [copy])

    async def process_copies(
        self,
        handler: Handler,
        copies: Sequence[Copy],
        *,
        on_claimed: Callable[[list[Copy], int], None] | None = None,
    ) -> bool:
        """Take a batch of copies to their outcomes, as :meth:`process_copy` takes one (the
        pull receiver of ``georep.servicebus``: one claim round trip for the batch).

        Args:
            handler: Called for each copy this consumer claimed.
            copies: Copies from :meth:`receive_copies`.
            on_claimed: Told, once the first claim answered, which copies go to the
                handler now, and how many of the others are settled as twins at once
                (their key was final already; the rest are parked).

        Returns:
            False when the receiver closed first and the copies still held were handed
            back (abandoned).
        """
        parked = list(copies)
        try:
            while parked:
                if self._stopping.is_set():
                    await self._abandon_all(parked)
                    return False
                parked = await self._turn(handler, parked, on_claimed)
                on_claimed = None
        except _Stopping:
            await self._abandon_all(parked)
            return False
        return True

    async def renew_locks(self, copies: Sequence[Copy]) -> None:
        """Renew the locks of ``copies`` that expire within half a lease."""
        await self._renew_locks(copies)

    async def peek(self, count: int) -> list[Any]:
        """Up to ``count`` messages of the region, without locking them."""
        async with self._settlements.lock:
            with bounded_call(self._clock, self.region.region, "a browse"):
                return list(await self.region.peek(count))

    async def may_hold(self, key: str, count: int = 256) -> bool:
        """Whether browsing the first ``count`` messages (any state, locked ones too) finds
        dedup key ``key``; True when the region does not answer (it may hold it)."""
        try:
            messages = await self.peek(count)
        except RegionError:
            return True
        source, name = self._policy.dedup_key.source, self._policy.dedup_key.name
        return any(self.region.delivery(m, source, name).key == key for m in messages)

    async def _receive(self, room: int, max_wait: float | None = None) -> list[Any]:
        """One receive call, bounded by georep's own deadline.

        The SDK can wait forever on a link lost under it; without this bound the loop
        (and :meth:`georep.GeoReceiver.aclose`, which waits for it) would hang.

        Raises:
            RegionError: The region failed, or did not answer within ``max_wait`` plus
                :data:`RECEIVE_GRACE` seconds (kind TIMEOUT).
        """
        region = self.region
        max_wait = self._policy.max_wait if max_wait is None else max_wait
        label = region.region
        with bounded_call(self._clock, label, "a receive", max_wait + RECEIVE_GRACE):
            async with self._settlements.lock:
                return await region.receive(room, max_wait=max_wait)

    def _region_warning(self, what: str, exc: RegionError, message: str, *args: object) -> None:
        """A warning that ``what`` failed in this region: logged once, then summarised per
        failure kind while it repeats."""
        _troubles.warning((what, self.region.entity, self.region.region, exc.kind), message, *args)

    async def _fresh(self, room: int, max_wait: float | None = None) -> list[Copy]:
        """Receive up to ``room`` copies; the pings among them are completed here."""
        messages = await self._receive(room, max_wait)
        source, name = self._policy.dedup_key.source, self._policy.dedup_key.name
        now = self._clock.time()
        fresh = [Copy(m, self.region.delivery(m, source, name), now, now) for m in messages]
        received = self._stats.received
        label = self.region.region
        received[label] = received.get(label, 0) + len(fresh)
        return await self._settlements.complete_pings(fresh)

    def _set_parked(self, parked: int) -> None:
        # The stats count every region's parked copies; this loop changes its own share.
        self._stats.parked += parked - self._parked
        self._parked = parked

    async def _turn(
        self,
        handler: Handler,
        copies: list[Copy],
        on_claimed: Callable[[list[Copy], int], None] | None = None,
    ) -> list[Copy]:
        """Claim, process, commit and settle one turn's copies; return those still parked.

        ``on_claimed`` is told which copies go to the handler, and how many are twins
        settled at once, once the claim answered.
        """
        checked, repeats = first_of_each_key(copies)
        held = copies
        known: list[tuple[Copy, ClaimState, str | None]] = []
        if self._recent:  # outcomes this receiver recorded: settled as twins, not claimed
            checked, known = self._known_outcomes(checked)
            settling = {id(copy) for copy, _, _ in known}
            copies = [c for c in copies if id(c) not in settling]
        # Keys a sibling loop of this receiver holds: their outcome is recorded here, so the
        # copy waits for it (parked) instead of asking the seen-set again each turn.
        waiting: list[Copy] = []
        if self._held_here:
            checked, waiting = self._held_by_siblings(checked)
        states = await self._claim(checked, held)
        turn = sort_by_claim(copies, checked, repeats, states)
        turn.twins += known
        # Parked behind a sibling loop that claimed them while this claim was under way:
        # woken by its outcome too, rather than when the pause runs out.
        late = self._held_by_siblings(turn.parked)[1] if turn.parked and self._held_here else []
        turn.parked += waiting
        waiting += late
        claimed = self._policy.keys(turn.to_process)
        self._held_here.hold(claimed, self.owner)
        try:
            parked, unchecked = turn.parked, turn.unchecked
            self._stats.unchecked += len(unchecked)
            if on_claimed is not None:
                on_claimed(turn.to_process + unchecked, len(turn.twins))
            # The duplicates: settled, never processed.
            await self._settlements.settle_twins(turn.twins)
            await self._process(handler, turn.to_process, unchecked, held=held)
        finally:
            # Recorded (or released) by now, or never will be by this turn: the twins
            # waiting for these keys go on.
            self._held_here.release(claimed, self.owner)
        for copy in parked:
            copy.parked_turns += 1
        if parked and len(parked) == len(held):
            # Nothing else to do this turn: give the other holder a moment before the
            # next claim instead of spinning on the store (receive() waits when idle, but
            # not while copies are parked and the entity is busy); a sibling's outcome
            # ends the wait at once.
            pause = min(0.05 * 2 ** min(parked[0].parked_turns, 5), 1.0)
            await self._wait_parked(waiting, pause)
        if parked:
            await self._renew_locks(parked)
        return parked

    def _held_by_siblings(self, checked: list[Copy]) -> tuple[list[Copy], list[Copy]]:
        """The copies to claim, and those whose key a sibling loop holds (they stay
        parked, their keys unclaimed)."""
        prefix = self._policy.scope_prefix
        to_claim: list[Copy] = []
        waiting: list[Copy] = []
        for copy in checked:
            held = self._held_here.elsewhere(prefix + str(copy.delivery.key), self.owner)
            (waiting if held else to_claim).append(copy)
        return to_claim, waiting

    async def _wait_parked(self, waiting: list[Copy], seconds: float) -> None:
        """Wait ``seconds``, less once a sibling lets go of the key of one of ``waiting``."""
        if not waiting:
            await self._clock.sleep(seconds)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held_here.wake(self._policy.keys(waiting), waiter)
        started = self._clock.monotonic()
        try:
            with contextlib.suppress(TimeoutError), self._clock.deadline(seconds):
                await waiter
        finally:
            waiter.cancel()
        # Stay a moment once the first outcome came: a puller completes its messages one
        # at a time, and the twins whose outcome arrived meanwhile settle together.
        linger = min(SETTLE_LINGER, seconds - (self._clock.monotonic() - started))
        if linger > 0 and not self._stopping.is_set():
            await self._clock.sleep(linger)

    def _known_outcomes(
        self, checked: list[Copy]
    ) -> tuple[list[Copy], list[tuple[Copy, ClaimState, str | None]]]:
        """The copies to claim, and those whose outcome this receiver recorded lately
        (with it, and its dead-letter reason)."""
        prefix = self._policy.scope_prefix
        unknown: list[Copy] = []
        known: list[tuple[Copy, ClaimState, str | None]] = []
        for copy in checked:
            outcome = self._recent.get(prefix + str(copy.delivery.key))
            if outcome is None:
                unknown.append(copy)
            else:
                known.append((copy, *outcome))
        return unknown, known

    async def _claim(self, checked: list[Copy], held: list[Copy]) -> list[ClaimState] | None:
        if not checked:
            return []
        started = self._clock.monotonic()
        keys = self._policy.keys(checked)
        backoff = _Backoff(self._clock)
        while True:
            try:
                states = await self._seen.claim(keys, owner=self.owner, lease=self._policy.lease)
                self._metrics.claim_latency(self._clock.monotonic() - started)
                _troubles.ended(_SEEN_SET_DOWN, "seen-set answers again")
                return states
            except StoreUnavailableError as exc:
                self._store_error()
                if self._policy.on_store_unavailable == "process":
                    _troubles.error(
                        _SEEN_SET_DOWN, "seen-set unreachable (%s): processing WITHOUT dedup", exc
                    )
                    return None
                if self._stopping.is_set():
                    # Closing: nothing was processed yet, so hand every copy back.
                    raise _Stopping from exc
                _troubles.error(
                    _SEEN_SET_DOWN,
                    "seen-set unreachable (%s): holding %d copies, retrying",
                    exc,
                    len(held),
                )
                await backoff.wait(None)
                await self._renew_locks(held)

    async def _store_call(self, held: list[Copy], call: Callable[[], Awaitable[object]]) -> bool:
        """A commit or release, retried until the store answers (copies stay locked).

        Returns False only when the receiver is closing and the store still does not
        answer: the caller then abandons the copies (processed again later: at least once).
        """
        backoff = _Backoff(self._clock)
        while True:
            try:
                await call()
                return True
            except StoreUnavailableError as exc:
                self._store_error()
                if self._policy.on_store_unavailable == "process":
                    return True
                if self._stopping.is_set():
                    _log.error("closing with the seen-set unreachable (%s): abandoning", exc)
                    return False
                _troubles.error(
                    _SEEN_SET_DOWN, "seen-set unreachable (%s): settlement waits for it", exc
                )
                await backoff.wait(None)
                await self._renew_locks(held)

    def _store_error(self) -> None:
        self._stats.store_errors += 1
        self._metrics.store_error()

    # --------------------------------------------------------------- processing

    async def _process(
        self, handler: Handler, claimed: list[Copy], unchecked: list[Copy], *, held: list[Copy]
    ) -> None:
        """Run the handler on every copy; record and settle each as soon as it finishes.

        A slow handler must not hold back its turn-mates: they are recorded and settled
        while it runs (batched with whatever else finished meanwhile), so a crash loses
        at most the work still running. Recording and settling are two stages: a copy is
        settled only after its outcome is recorded, but the next batch's outcome is
        recorded while the broker settles the one before (a puller that completes one
        message at a time waits for the seen-set, not for the previous settlement too).
        """
        copies = claimed + unchecked
        if not copies:
            return
        checked = {id(c) for c in claimed}
        self._stats.in_flight += len(copies)
        done = asyncio.Event()
        renewer = start_task(
            self._keep_alive(held, claimed, done), name=f"georep-renew {self.region.region}"
        )
        try:
            if len(copies) == 1:  # no tasks to spread over: the common case when idle-ish
                batch = [(copies[0], await self._handle(handler, copies[0]))]
                await self._settle_recorded(await self._record(batch, checked, held))
            else:
                await self._process_concurrently(handler, copies, checked, held)
        finally:
            # Told as well as cancelled: an SDK call can swallow a cancellation (Python
            # 3.11's asyncio.wait_for returns a result that raced it, cpython gh-86296),
            # and the renewer would then renew for ever while this region's loop waits.
            done.set()
            # stop_task: bounded, and a cancellation of this loop that arrives meanwhile
            # goes on (awaiting the cancelled renewer under suppress swallowed it).
            await stop_task(renewer, clock=self._clock)

    async def _process_concurrently(
        self, handler: Handler, copies: list[Copy], checked: set[int], held: list[Copy]
    ) -> None:
        """:meth:`_process` for several copies: a task per handler, a recording stage and
        a settling stage, each taking what the stage before it finished meanwhile."""
        finished: asyncio.Queue[tuple[Copy, Decision]] = asyncio.Queue()
        recorded: asyncio.Queue[list[tuple[Copy, Decision, bool]]] = asyncio.Queue()

        async def one(copy: Copy) -> None:
            finished.put_nowait((copy, await self._handle(handler, copy)))

        async def record_as_they_finish() -> None:
            remaining = len(copies)
            while remaining:
                batch = await _all_waiting(finished)
                remaining -= len(batch)
                recorded.put_nowait(await self._record(batch, checked, held))

        async def settle_as_recorded() -> None:
            remaining = len(copies)
            while remaining:
                members = [m for batch in await _all_waiting(recorded) for m in batch]
                if len(members) < remaining:  # others still undecided: wait for a few
                    members += await self._recorded_soon(recorded, remaining - len(members))
                remaining -= len(members)
                await self._settle_recorded(members)

        stages = [
            asyncio.ensure_future(stage)
            for stage in (settle_as_recorded(), record_as_they_finish(), *map(one, copies))
        ]
        try:
            await asyncio.gather(*stages)
        finally:
            # A stage that failed must not leave the others waiting on its queue for ever.
            for stage in stages:
                stage.cancel()

    async def _handle(self, handler: Handler, copy: Copy) -> Decision:
        """Run the handler on one copy; what it decided (or the default for how it ended).

        No decision: complete if it returned, abandon if it raised. An abandon on the
        copy's ``max_attempts``-th delivery becomes a dead-letter.
        """
        span = self._settlements.start_span("process", copy)
        message = copy.message
        error: Exception | None = None
        self._decisions.begin(message)
        try:
            result = handler(message)
            # A plain ``def`` handler has run already: awaiting its None would fail it, and
            # the message would be handed out again after its work was done.
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            error = exc
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            _log.warning(
                "handler failed for %s from %s (delivery %d): %r",
                copy.delivery.key,
                self.region.region,
                copy.delivery.delivery_count,
                exc,
            )
        finally:
            copy.handled_at = self._clock.time()
            decided = self._decisions.end(message)
            span.end()
            self._stats.in_flight -= 1
        decision = decided or (COMPLETE if error is None else ABANDON)
        if decision.settle is Settle.ABANDON and not decision.returned:
            self._stats.failed += 1
            self._metrics.copy("failed", self.region.region)
            max_attempts = self._policy.max_attempts
            if copy.delivery.delivery_count >= max_attempts:
                decision = max_attempts_decision(copy.delivery.delivery_count, max_attempts, error)
        self._settlements.count(decision)
        return decision

    async def _record(
        self, batch: list[tuple[Copy, Decision]], checked: set[int], held: list[Copy]
    ) -> list[tuple[Copy, Decision, bool]]:
        """Record the batch's outcomes in the seen-set (one call per outcome); each copy
        with its decision and whether it may be settled so.

        A copy whose outcome could not be recorded (closing with the store unreachable) is
        abandoned instead: settling it for good would hide it from its twin.
        """
        groups: dict[ClaimState | None, list[tuple[Copy, Decision]]] = {}
        for copy, decision in batch:
            if id(copy) in checked:
                groups.setdefault(decision.state, []).append((copy, decision))
        recorded: dict[ClaimState | None, bool] = {}
        for state, members in groups.items():
            recorded[state] = await self._store_call(held, self._record_call(state, members))
        return [
            (copy, decision, id(copy) not in checked or recorded[decision.state])
            for copy, decision in batch
        ]

    async def _recorded_soon(
        self, recorded: asyncio.Queue[list[tuple[Copy, Decision, bool]]], most: int
    ) -> list[tuple[Copy, Decision, bool]]:
        """Up to ``most`` more recorded copies, those that come within :data:`SETTLE_LINGER`."""
        members: list[tuple[Copy, Decision, bool]] = []
        with contextlib.suppress(TimeoutError), self._clock.deadline(SETTLE_LINGER):
            while len(members) < most:
                members += await recorded.get()
        return members

    async def _settle_recorded(self, batch: list[tuple[Copy, Decision, bool]]) -> None:
        """Settle copies whose outcome :meth:`_record` recorded (abandon those it could
        not; the completions together), and write their ledger rows."""
        decided = [(copy, decision if kept else ABANDON) for copy, decision, kept in batch]
        taken = await self._settlements.settle_all(decided)
        for (copy, decision, _), settled in zip(batch, taken, strict=True):
            # A handler that succeeded counts as processed even if its commit could not be
            # made and the copy was abandoned: its effects happened.
            self._settlements.record(copy, LEDGER_OUTCOMES[decision.settle], settled)

    def _record_call(
        self, state: ClaimState | None, members: list[tuple[Copy, Decision]]
    ) -> Callable[[], Awaitable[object]]:
        """The seen-set call that records ``members``' outcome ``state`` (None: release)."""
        keys = self._policy.keys([copy for copy, _ in members])
        if state is None:

            async def release() -> None:
                await self._seen.release(keys, owner=self.owner)
                self._held_here.release(keys, self.owner)

            return release
        reasons = (
            [d.recorded_reason for _, d in members] if state is ClaimState.DEAD_LETTERED else None
        )

        async def commit() -> None:
            await self._seen.commit(keys, owner=self.owner, outcome=state, reasons=reasons)
            self._recent.add(keys, state, reasons)
            self._held_here.release(keys, self.owner)

        return commit

    # ----------------------------------------------------------------- renewals

    async def _keep_alive(
        self, held: list[Copy], processing: list[Copy], done: asyncio.Event
    ) -> None:
        """Until ``done`` (while handlers run): renew every held copy's lock and our claims'
        leases.

        Wakes at a third of the lease, or at half the time left on the soonest lock,
        whichever comes first (a queue's lock duration can be far shorter than the lease).
        """
        lease = self._policy.lease
        while not done.is_set():
            now = self._clock.time()
            lock_left = [
                c.delivery.locked_until - now
                for c in held
                if not c.settled and c.delivery.locked_until is not None
            ]
            interval = min([lease / 3, 10.0, *(left / 2 for left in lock_left)])
            await self._clock.sleep(max(interval, 0.05))
            await self._renew_locks(held, margin=2 * max(interval, 0.05))
            await self._extend_claims([c for c in processing if not c.settled])

    async def _extend_claims(self, running: list[Copy]) -> None:
        keys = self._policy.keys(running)
        if not keys:
            return
        try:
            kept = await self._seen.extend(keys, owner=self.owner, lease=self._policy.lease)
        except StoreUnavailableError:
            return
        for key, ok in zip(keys, kept, strict=True):
            # A key its owner committed outside the receiver (record_outcomes) is done,
            # not lost to another consumer.
            if not ok and self._recent.get(key) is None:
                _log.warning(
                    "lost the claim on %s in %s while its handler ran: another consumer "
                    "may process it too (raise lease= above the handler's run time)",
                    key,
                    self.region.region,
                )

    async def _renew_locks(self, copies: Sequence[Copy], margin: float | None = None) -> None:
        """Renew the locks that expire within ``margin`` seconds (default: half a lease)."""
        margin = self._policy.lease / 2 if margin is None else margin
        now = self._clock.time()
        for copy in copies:
            locked_until = copy.delivery.locked_until
            if copy.settled or (locked_until is not None and locked_until - now > margin):
                continue
            async with self._settlements.lock:
                await self._renew(copy, "a lock renewal")

    async def renew_session_lock(self, copy: Copy) -> bool:
        """Session mode: renew the lock of ``copy``'s session (all its copies share it)
        now; False when the region refused or did not answer in time.

        Unlike the other calls on the region it does not queue behind the one in progress
        (a browse or a receive can take as long as a short lock lasts): the SDK renews
        locks beside a receiver's other calls, as its AutoLockRenewer does.
        """
        return await self._renew(copy, "a session lock renewal")

    async def _renew(self, copy: Copy, what: str) -> bool:
        """Renew ``copy``'s lock (bounded); False when the region refused or did not answer."""
        if copy.settled:
            return True
        now = self._clock.time()
        try:
            with bounded_call(self._clock, self.region.region, what):
                new_expiry = await self.region.renew_lock(copy.message)
        except RegionError as exc:
            self._region_warning(
                "renew", exc, "could not renew a lock in %s (%s): %s", self.region.region, what, exc
            )
            return False
        copy.delivery = dataclasses.replace(copy.delivery, locked_until=new_expiry)
        copy.renewed_at = now
        return True

    async def _abandon_all(self, copies: list[Copy]) -> None:
        for copy in copies:
            with (
                contextlib.suppress(RegionError),
                bounded_call(self._clock, self.region.region, "an abandon"),
            ):
                await self.region.abandon(copy.message)
