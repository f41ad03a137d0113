"""Pull receiving over a GeoReceiver: ask for messages, then settle each one with a call.

The SDK's receivers are pulled: the application asks for messages (``receive_messages``,
iteration) and settles each one (``complete_message``...). A GeoReceiver pushes: it calls a
handler. :class:`PullReceiver` joins the two without a second implementation of receiving:
its handler hands each claimed message to the puller (a :class:`Handout`) and waits for the
application's decision; the GeoReceiver's region loops then record it in the seen-set and
settle the copy in its region, as they do for any handler. So claim → process → commit →
settle, the twin's outcome, lock and lease renewal and the ``max_attempts`` rule stay those
of :mod:`georep.receive.region_loop`.

Fetching. Each region has a fetcher task that receives while the application waits for
messages (as many as it still lacks, plus ``prefetch``, plus up to :data:`READ_AHEAD` while
the application keeps up), from both regions at once. Once nothing has been asked for
:data:`SWEEP_AFTER`, it sweeps: copies at the head of its region whose key is already
final (the twins of messages settled from the other region) are received and settled, so a
program that stops receiving leaves no copy behind that its one-region run would not
(while the program keeps asking, the receives take those twins anyway).
Copies received beyond what was asked for wait in the buffer, claimed and with their locks
renewed, for the next call (or go back unseen when the receiver closes). Beyond
``prefetch``, they wait at most :data:`IDLE_RETURN` of the application not asking: a
program that breaks out of its receive loop and keeps the receiver open would otherwise
keep them from every other receiver for as long as it lives.

Settling. A decision returns once the region loop has it, as the SDK's ``complete_message``
returns once its disposition is sent, without the broker's answer: the loop records it in
the seen-set (one call for the decisions that came meanwhile, where waiting for each one's
round trip made a puller that completes one message at a time wait for every one), then
settles the copy in its region and its twin in the other. Its outcome is the message's from
the record on: a copy whose settlement fails, in a region that went down, gets the same
outcome when it is redelivered, so the call neither waits for nor raises on it. A copy
without a dedup key has nothing to record: its call returns once its region settled it.
Closing waits (bounded) for the decisions still being recorded and settled. A process that
dies between the call and the record leaves the message to be handed out again once its
lock and claim run out (at least once), as an SDK disposition lost with its connection does.

Catching up. A region whose copies are all twins of messages settled from the other
region is behind it. While nothing is asked for, its fetcher goes on receiving such twins
(:data:`CHASE_MOST`), and when a turn of twins ends or the other region's handed-out
messages were settled, it sweeps once nothing was asked for :data:`KEEPING_UP` (rather
than :data:`SWEEP_AFTER`), so that twins are settled as the application goes, not left
for an idle sweep a second later.
"""

from __future__ import annotations

__all__ = ["Handout", "PullReceiver", "SettleDeferred", "SettleProbe"]

import asyncio
import contextlib
import logging
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from georep._channel import CALL_SECONDS, bounded_call
from georep._classify import every_region_refused
from georep._clock import SystemClock
from georep._lifecycle import AsyncResource, close_all, start_task, stop_tasks
from georep._region_identity import RegionLabels
from georep.exceptions import (
    AllRegionsUnavailableError,
    AlreadySettledError,
    ClosedError,
    ConfigurationError,
    RegionError,
    SettlementError,
    StoreUnavailableError,
    region_error,
)
from georep.ports import (
    FINAL_STATES,
    ClaimState,
    Clock,
    Delivery,
    ErrorKind,
    RegionReceiver,
    SeenStore,
)
from georep.receive.outcomes import ABANDON, COMPLETE, RETURNED, Decision, Settle
from georep.receive.receiver import GeoReceiver
from georep.receive.region_loop import RECEIVE_GRACE, RegionLoop
from georep.receive.settlement import Copy, complete_all

_log = logging.getLogger("georep.receiver")

SETTLED_REMEMBERED: Final = 10_000
"""Settled messages a receiver remembers, to tell a second settlement of one apart."""

BATCH_GAP: Final = 0.2
"""Seconds a receive call keeps collecting after a message arrived (the SDK's
further-pull window): it returns once no more arrived for this long."""
ROUND_GRACE: Final = 0.3
"""Seconds past :data:`BATCH_GAP` a receive call waits at most for a region's receive
under way (or the claim of what it brought): the SDK's receiver returns what its region
delivered for the call, and a region's receive that holds fewer copies than asked waits
out the SDK's own window (its 0.2 s socket timeout) before it returns them. Without
this, a call that began with copies read ahead, or got one region's copies first, was
cut short (``receive_messages(5)`` returned 1 of the 5 waiting, and a loop that drains
until a batch comes back short stopped early)."""
READ_AHEAD: Final = 8
"""Copies fetched at most beyond what was asked for (and ``prefetch``) while the
application asks again at once each time it is given what it asked for (an ``async for``
loop that keeps up): each message then comes from the buffer instead of a round trip to
its region and the seen-set. A call that comes later than :data:`KEEPING_UP` after the
previous one returned stops it (a slow consumer holds no more locks than it asked for)."""
KEEPING_UP: Final = 0.05
"""Seconds between a receive's return and the next call under which the application
counts as keeping up."""
IDLE_RETURN: Final = 1.0
"""Seconds without a receive call after which the copies read ahead beyond ``prefetch``
(the read-ahead, a chase's copies) go back unseen to their regions, for other receivers
(a sessionless receiver: a session's messages are this receiver's anyway)."""
OPEN_WAIT: Final = 5.0
"""Seconds :meth:`PullReceiver.open` waits at most for a region's link to open (a region
still opening then goes on in the background)."""
SWEEP_AFTER: Final = 1.0
"""Seconds after a receive call returned before an idle region is swept (unordered): while
the application keeps asking, both regions' fetchers receive, and so settle, the twins at
their heads anyway, and a sweep's browse (32 messages decoded, their keys looked up) took a
tenth of the client's CPU in ``benchmarks/dropin_receiver.py``."""
CHASE_MOST: Final = 32
"""Copies a fetcher receives at most without being asked, while its region is behind: its
last receive brought only twins of messages settled from the other region (it receives
twice as many as that receive brought, up to this). A receive that brings anything else
ends the chase; a copy nobody asked for waits in the buffer, claimed, for the next call."""
ABANDON_WAIT: Final = 2.0
"""Seconds an abandon waits at most for itself, and the copies it hands back, to reach
their regions (see :meth:`PullReceiver._abandon_in_order`): the order it keeps needs the
region's answer, and a region that does not answer (a blackhole) holds the program no
longer than this (the SDK's abandon sends its disposition and returns)."""
BUSY_POLL: Final = 0.1
"""Seconds a receive waits on an empty region while this receiver holds copies there."""
_SWEEP_PEEK: Final = 32
"""Messages browsed at the head of an idle region to find twins already settled."""
_BACKOFF_MAX: Final = 5.0
_ACTIVE: Final = 0
_DEFERRED: Final = 1
"""``ServiceBusMessageState`` values of a browsed message (the core reads the number)."""


SettleDeferred = Callable[["SettleProbe", list[tuple[Any, ClaimState]]], Awaitable[None]]
"""Settles deferred copies of one region whose key is final (see PullReceiver)."""


@dataclass(eq=False, slots=True)
class Handout:
    """One logical message on its way to (or with) the application.

    Attributes:
        message: The region's copy (the SDK's ``ServiceBusReceivedMessage``).
        region: The label of the region it came from.
        decided: Resolved with the application's decision (or abandon on close).
        settled: Resolved once the region loop settled the copy: None, or the error the
            region answered with (the outcome is in the seen-set either way).
        handed_out: Given to the application (not just waiting in the buffer).
        key: Its dedup key (None: it has none).
    """

    message: Any
    region: str
    decided: asyncio.Future[Decision]
    settled: asyncio.Future[BaseException | None]
    handed_out: bool = False
    key: str | None = None


class SettleProbe(RegionLabels):
    """A region's receiver, as the GeoReceiver's region loop uses it, that also tells the
    pull receiver when a copy was settled, and serialises every call on the region.

    The SDK's receivers take one call at a time; the region loop serialises its own calls,
    and this lock adds the pull receiver's (lock renewals, browsing, deferred messages).
    It answers to the region, namespace and entity of ``inner``.

    Args:
        inner: The region's receiver.
        on_settled: Called after every settlement, with this probe, the copy, the error
            (or None) and the operation (``complete``, ``abandon``, ``dead_letter``,
            ``defer``).
    """

    def __init__(
        self,
        inner: RegionReceiver,
        on_settled: Callable[[SettleProbe, Any, BaseException | None, str], None],
    ) -> None:
        super().__init__(inner.region, inner.namespace, inner.entity)
        self.inner = inner
        self.lock = asyncio.Lock()
        self._on_settled = on_settled

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        return self.inner.delivery(message, dedup_source, dedup_name)

    async def call(self, operation: Callable[[RegionReceiver], Awaitable[Any]]) -> Any:
        """Run ``operation(inner)`` alone on the region."""
        async with self.lock:
            return await operation(self.inner)

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        async with self.lock:
            return await self.inner.receive(max_messages, max_wait=max_wait)

    async def peek(self, count: int) -> list[Any]:
        async with self.lock:
            return await self.inner.peek(count)

    async def _settle(
        self, message: Any, name: str, operation: Callable[[], Awaitable[None]]
    ) -> None:
        error: BaseException | None = None
        try:
            async with self.lock:
                await operation()
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._on_settled(self, message, error, name)

    async def complete(self, message: Any) -> None:
        await self._settle(message, "complete", partial(self.inner.complete, message))

    async def complete_many(self, messages: list[Any]) -> None:
        """Complete ``messages`` in one call where the region offers ``complete_many``
        (else one at a time); each is reported settled, or not, as :meth:`complete` does."""
        error: BaseException | None = None
        try:
            async with self.lock:
                await complete_all(self.inner, messages)
        except BaseException as exc:
            error = exc
            raise
        finally:
            for message in messages:
                self._on_settled(self, message, error, "complete")

    async def abandon(self, message: Any) -> None:
        await self._settle(message, "abandon", partial(self.inner.abandon, message))

    async def release(self, message: Any) -> None:
        """Hand the copy back unseen where the region can (not a delivery attempt there),
        else abandon it."""
        release = getattr(self.inner, "release", None) or self.inner.abandon
        await self._settle(message, "abandon", partial(release, message))

    async def dead_letter(self, message: Any, reason: str | None, description: str | None) -> None:
        dead_letter = partial(self.inner.dead_letter, message, reason, description)
        await self._settle(message, "dead_letter", dead_letter)

    async def defer(self, message: Any) -> None:
        await self._settle(message, "defer", partial(self.inner.defer, message))

    async def renew_lock(self, message: Any) -> float | None:
        async with self.lock:
            return await self.inner.renew_lock(message)

    async def close(self) -> None:
        """Nothing: the pull receiver closes the regions it owns itself."""


@dataclass(eq=False, slots=True)
class _Batch:
    """Copies one receive returned that may still reach the buffer (counted as arriving)."""

    fetch: _Fetch
    expected: set[int]
    keys: dict[int, str | None] = field(default_factory=dict)
    """The copies' dedup keys, by ``id()`` of the message (read once, when received)."""
    handed: bool = False
    """Some of the copies went to the application (claimed for it)."""
    epoch: int = 0
    """:attr:`PullReceiver._epoch` when the receive that brought them began."""

    def arrived(self, message_ids: Iterable[int]) -> None:
        for message_id in message_ids:
            if message_id in self.expected:
                self.expected.discard(message_id)
                self.fetch.arriving -= 1


@dataclass(eq=False, slots=True)
class _Fetch:
    """One region's fetcher and what it has received that is not in the buffer yet."""

    loop: RegionLoop
    probe: SettleProbe
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    arriving: int = 0
    task: asyncio.Task[None] | None = None
    dry: bool = False
    """Its last receive for what was asked came back empty or failed (``ordered``: the
    next region may receive then)."""
    held: Counter[str] = field(default_factory=Counter)
    """Seen-set keys of the copies this receiver holds in the region (locked by it until
    their turn ends): a receive passes over them."""
    failing: RegionError | None = None
    """The region's answer to its last receive when that failed; None once one succeeds."""
    failures: int = 0
    """Receives from the region failed in a row."""
    lock_lost: bool = False
    """A receive failed because the session's lock in the region was lost (a session
    receiver): until one succeeds again, the receiver's failures say the session may be
    held by another receiver now, not that the regions are down."""
    swept_in_vain: bool = False
    """A sweep's receive took a copy nobody asked for (handed back): the final copies at
    the head are locked by another receiver, and sweeping again at once would take the
    same copies again."""
    begun: int = 0
    """Receives from the region for what was asked that began."""
    rounds: int = 0
    """Of those, the ones that ended (with copies, without, or failed)."""
    failed_total: int = 0
    """Receives from the region that failed, ever (a receive call tells the failures that
    came while it waited from those before it)."""
    chase: int = 0
    """Copies to receive without being asked: its last receive brought only twins of
    messages settled from the other region (the region is behind it; see :data:`CHASE_MOST`)."""
    behind: bool = False
    """Its last turn ended with none of its copies handed out (twins only, some parked
    until the other region's outcome came): the region is behind the other one."""
    frontier: bool = False
    """Its region, behind the other, may hold twins that are final now: its own last turn
    ended so, or a turn of the other region's that handed messages out ended. Once nothing
    was asked for :data:`KEEPING_UP`, the fetcher sweeps once, instead of after
    :data:`SWEEP_AFTER`."""


class PullReceiver(AsyncResource):
    """Receive from a queue or subscription in two regions by asking, and settle by calls.

    Each logical message is handed out once across both regions and every process sharing
    the seen-set: claimed when it reaches this receiver, recorded when the application
    completes or dead-letters (or defers) it, released when it abandons it or the receiver
    closes. Locks (and claims) of messages handed out are renewed until they are settled.

    Args:
        primary: The primary region's peek-lock receiver (a RegionReceiver).
        secondary: The secondary region's.
        seen: The shared seen-set.
        receive_and_delete: Settle each message as it is handed out (the SDK's
            RECEIVE_AND_DELETE): the application cannot settle it, and a message is
            completed only once handed out (one waiting in the buffer when the receiver
            closes is abandoned, never lost).
        prefetch: Messages kept ready beyond what the application asked for.
        poll: Seconds one receive call to a region waits when it is empty (the
            GeoReceiver's ``max_wait``): an idle region is swept this often.
        sweep: Settle copies already settled elsewhere while idle and on close.
        ordered: Receive what is asked for from one region at a time, in preference order
            (primary first): the next region only while those before it come back empty
            or fail; the others only sweep. A session's messages are then handed out in
            one region's order.
        owned: Region receivers this object created: closed with it.
        on_twin_deferred: Told ``(dedup key, region label, copy)`` of each copy deferred
            here because its key was deferred already (its twin's, or an earlier copy's):
            whoever receives deferred messages needs its sequence number to settle it.
        settle_deferred: Given the deferred copies a sweep found whose key is final now
            (with that state): settles them (a receive never takes a deferred copy).
        clock: Time source (tests inject :class:`georep.testing.FakeClock`).
        receiver_options: Passed to :class:`georep.GeoReceiver` (``lease``,
            ``max_attempts``, ``dedup_key``, ``ledger``...).

    Raises:
        ConfigurationError: As :class:`georep.GeoReceiver` (session mode is not pulled here).
    """

    def __init__(
        self,
        primary: RegionReceiver,
        secondary: RegionReceiver,
        *,
        seen: SeenStore,
        receive_and_delete: bool = False,
        prefetch: int = 0,
        poll: float = 1.0,
        sweep: bool = True,
        ordered: bool = False,
        owned: Sequence[Any] = (),
        on_twin_deferred: Callable[[str, str, Any], None] | None = None,
        settle_deferred: SettleDeferred | None = None,
        clock: Clock | None = None,
        receiver_options: Mapping[str, Any] | None = None,
    ) -> None:
        options = dict(receiver_options or {})
        if options.get("sessions"):
            raise ConfigurationError("a PullReceiver reads sessionless entities")
        if prefetch < 0:
            raise ConfigurationError(f"prefetch must be 0 or more, not {prefetch}")
        self._clock: Clock = clock or SystemClock()
        self._probes = [SettleProbe(r, self._settled) for r in (primary, secondary)]
        self.geo = GeoReceiver(
            *self._probes, seen=seen, max_wait=poll, clock=self._clock, **options
        )
        self.seen = seen
        self.receive_and_delete = receive_and_delete
        self.prefetch = prefetch
        self.read_ahead = 0
        """Copies fetched now beyond what is asked for and ``prefetch`` (see
        :data:`READ_AHEAD`)."""
        self._returned_at: float | None = None
        self.poll = poll
        self._sweep = sweep
        self._ordered = ordered
        self._owned = list(owned)
        self._on_twin_deferred = on_twin_deferred
        self._settle_deferred = settle_deferred
        # The GeoReceiver's region loops, one per region (it is never run(): the fetchers
        # below drive its loops' receive and process steps).
        loops: list[RegionLoop] = list(self.geo._loops)
        self._fetches = {
            loop.region.region: _Fetch(loop, probe)
            for loop, probe in zip(loops, self._probes, strict=True)
        }
        self._buffer: deque[Handout] = deque()
        self._held: dict[int, Handout] = {}
        # Messages settled lately (id -> weak reference), so that settling one again
        # raises the SDK's MessageAlreadySettled rather than "not handed out".
        self._settled_messages: OrderedDict[int, weakref.ref[Any]] = OrderedDict()
        self._arrivals: dict[int, _Batch] = {}
        self._epoch = 0
        """Abandons applied so far (see :meth:`_abandon_in_order`): copies whose receive
        began before the last one was applied are handed back, not handed out."""
        self._wanted = 0
        self._waiters: set[asyncio.Future[None]] = set()
        self._turns: set[asyncio.Task[bool]] = set()
        self._closing = False
        self._stop_fetching = asyncio.Event()
        self._started = False
        self._opening: list[asyncio.Task[bool]] = []

    @property
    def entity(self) -> str:
        """The entity path both regions' receivers read."""
        return self.geo.entity

    @property
    def clock(self) -> Clock:
        """The time source of this receiver."""
        return self._clock

    @property
    def regions(self) -> list[SettleProbe]:
        """Both regions' receivers, primary first (each call on one through its lock)."""
        return list(self._probes)

    # ------------------------------------------------------------------- receiving

    async def open(self, wait: float = OPEN_WAIT) -> None:
        """Open both regions' links now, as the SDK's ``async with receiver`` opens its
        one, so that the first receive does not wait for them. Idempotent.

        Returns once a region's link is open, every region failed, or ``wait`` seconds
        passed: a region that is down or slow does not hold the caller up, and goes on
        opening in the background (its first receive waits for it). Regions that are
        down raise nothing here (a receive raises what they answer then).

        Raises:
            ClosedError: The receiver was closed.
            RegionError: Every region refused the receiver's settings (its key, its
                entity): the primary's refusal (an ``EntityNotFoundError``,
                ``AuthenticationError``...), as the SDK's receiver raises when it opens.
        """
        self._check_open()
        if self._opening:
            return
        self._opening = [
            start_task(self._open_region(fetch), name=f"georep-open {label}")
            for label, fetch in self._fetches.items()
        ]
        pending: set[asyncio.Task[bool]] = set(self._opening)
        with contextlib.suppress(TimeoutError), self._clock.deadline(wait):
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task.result() for task in done):
                    return
        if not pending:
            self._raise_if_refused()

    async def _open_region(self, fetch: _Fetch) -> bool:
        """Open one region's link (bounded); whether it opened."""
        opener = getattr(fetch.probe.inner, "open", None)
        if opener is None:
            return True  # a receiver without links to open (a test double)
        try:
            with bounded_call(self._clock, fetch.probe.region, "opening the link"):
                await fetch.probe.call(lambda _: opener())
        except RegionError as exc:
            _log.debug("opening %s's link failed: %s", fetch.probe.region, exc)
            fetch.failing = exc  # a receive meets the same answer (a refusal is raised)
            return False
        return True

    async def receive(self, max_count: int, max_wait: float | None) -> list[Handout]:
        """Up to ``max_count`` messages, waiting at most ``max_wait`` seconds for the first
        (None: until one arrives); then collecting while more arrive within
        :data:`BATCH_GAP` of each other.

        Returns:
            The handouts, already marked handed out (empty once the receiver closes).

        Raises:
            ClosedError: The receiver was closed.
            ConfigurationError: ``max_count`` is below 1.
            RegionError: Every region refused the receiver's settings (its key, its
                entity) and none had a message for it.
            AllRegionsUnavailableError: Nothing was received and every region's receives
                kept failing (both regions down).
        """
        self._check_open()
        if max_count < 1:
            raise ConfigurationError(f"max_message_count must be 1 or more, not {max_count}")
        self._start_fetching()
        self._pace()
        got = self._take(max_count)
        failed_before = {label: f.failed_total for label, f in self._fetches.items()}
        clock = self._clock
        deadline = None if max_wait is None else clock.monotonic() + max(max_wait, 0.0)
        last = clock.monotonic() if got else None
        asked = max_count - len(got)
        self._wanted += asked
        self._wake_fetchers()
        try:
            while len(got) < max_count and not self._closing:
                if not got:
                    self._raise_if_refused()
                    self._raise_if_unavailable(failed_before)
                now = clock.monotonic()
                gap_end = None if last is None else last + BATCH_GAP
                if gap_end is not None and now >= gap_end and self._answering():
                    # A region's receive is under way, or what one brought is being
                    # claimed: the SDK's receiver returns what its region delivered for the
                    # call, so wait for it a little longer (a region's receive waits out
                    # the SDK's own 0.2 s when it holds fewer copies than asked).
                    gap_end += ROUND_GRACE
                limits = [t for t in (deadline, gap_end) if t is not None]
                remaining = None if not limits else min(limits) - now
                if remaining is not None and remaining <= 0:
                    break
                if not await self._wait_for_arrival(remaining):
                    continue  # the gap or the deadline: decided above, with what is under way
                more = self._take(max_count - len(got))
                if more:
                    got.extend(more)
                    self._wanted -= len(more)
                    asked -= len(more)
                    last = clock.monotonic()
        except BaseException:
            # The caller never gets them (cancelled): back to the front of the buffer,
            # not settled, for the next call (they stay claimed and locked meanwhile).
            self._put_back(got)
            raise
        finally:
            self._wanted -= asked
            self._returned_at = clock.monotonic()
        if not got and not self._closing:
            self._raise_if_unavailable()
        if self.receive_and_delete:
            for handout in got:
                handout.decided.set_result(COMPLETE)
        return got

    def _pace(self) -> None:
        """Adjust :attr:`read_ahead` as a receive call begins: doubled (up to
        :data:`READ_AHEAD`) when the application came back at once to an empty buffer,
        dropped when it came back late."""
        returned = self._returned_at
        if returned is None or self._clock.monotonic() - returned > KEEPING_UP:
            self.read_ahead = 0
        elif not self._buffer:
            self.read_ahead = min(max(1, 2 * self.read_ahead), READ_AHEAD)

    def _raise_if_refused(self) -> None:
        """Raise the first region's refusal when every region refused this receiver's
        settings (its key, its entity): the SDK's receiver raises it too.

        Raises:
            RegionError: The primary's refusal (an ``AuthenticationError``,
                ``EntityNotFoundError``..., each also the SDK's class).
        """
        refusal = every_region_refused([fetch.failing for fetch in self._fetches.values()])
        if refusal is not None:
            raise refusal

    def _raise_if_unavailable(self, failed_before: Mapping[str, int] | None = None) -> None:
        """Raise when every region's receives have failed (twice in a row at least, so a
        region that failed once while the call began is not an outage), as the SDK's
        receiver raises when its namespace is down: after a receive that got nothing, or
        while it waits once each region failed again since ``failed_before`` (each fetch's
        ``failed_total`` when the call began), not only when its ``max_wait_time`` ends.

        Raises:
            AllRegionsUnavailableError: With each region's last error (also the SDK's
                ``ServiceBusConnectionError``).
        """
        fetches = list(self._fetches.values())
        if not fetches or not all(f.failing is not None and f.failures >= 2 for f in fetches):
            return
        if failed_before is not None and any(
            f.failed_total <= failed_before.get(label, 0) for label, f in self._fetches.items()
        ):
            return  # a region has not failed since the call began: it may answer it
        if self._ordered and any(f.lock_lost for f in fetches):
            # The session's lock was lost (in a region that said so; the other may only
            # time out reattaching to a session another receiver holds now), and receiving
            # again failed everywhere: as the SDK's session receiver raises
            # SessionLockLostError once its lock is lost.
            lost = next(f for f in fetches if f.lock_lost)
            raise region_error(
                f"the lock on this receiver's session of {self.entity!r} was lost (it "
                "expired, or another receiver holds the session now) and no region could "
                "receive from it again: accept the session again with a new receiver",
                region=lost.probe.region,
                kind=ErrorKind.LOCK_LOST,
                inner_exception=lost.failing,
            )
        causes = {f.probe.region: f.failing for f in fetches if f.failing is not None}
        raise AllRegionsUnavailableError(f"no region could receive from {self.entity!r}", causes)

    def _put_back(self, handouts: list[Handout]) -> None:
        for handout in reversed(handouts):
            handout.handed_out = False
            self._buffer.appendleft(handout)
        if handouts:
            self._notify()

    async def _wait_for_arrival(self, seconds: float | None) -> bool:
        """Wait until a message reaches the buffer (or the receiver closes); False on timeout."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            if seconds is None:
                await waiter
                return True
            with self._clock.deadline(seconds):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.discard(waiter)

    def _answering(self) -> bool:
        """Whether a region's receive for what was asked is under way, or what one brought
        is still being claimed."""
        return any(f.begun > f.rounds or f.arriving for f in self._fetches.values())

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _take(self, count: int) -> list[Handout]:
        taken: list[Handout] = []
        while self._buffer and len(taken) < count:
            handout = self._buffer.popleft()
            if handout.decided.done():  # abandoned on close
                continue
            handout.handed_out = True  # settled on hand-out (RECEIVE_AND_DELETE) on return
            taken.append(handout)
        return taken

    def _wake_fetchers(self) -> None:
        for fetch in self._fetches.values():
            fetch.wake.set()

    # ------------------------------------------------------------------- settling

    def handout(self, message: Any, operation: str) -> Handout:
        """The live handout of ``message``.

        Raises:
            ConfigurationError: The receiver settles on hand-out (RECEIVE_AND_DELETE).
            SettlementError: ``message`` was not handed out by this receiver, or was
                settled already.
        """
        if self.receive_and_delete:
            raise ConfigurationError(
                f"{operation}: not supported in RECEIVE_AND_DELETE mode (the message was "
                "settled as it was handed out)"
            )
        handout = self._held.get(id(message))
        if (handout is not None and handout.handed_out and handout.decided.done()) or (
            handout is None and self._was_settled(message)
        ):
            raise AlreadySettledError(  # the SDK's MessageAlreadySettled
                f"{operation}: this message was settled already (completed, abandoned, "
                "dead-lettered or deferred)"
            )
        if handout is None or not handout.handed_out:
            raise SettlementError(
                f"{operation}: this message is not one this receiver handed out and has not "
                "settled yet (it was settled already, came from another receiver, or was "
                "peeked)"
            )
        return handout

    def _was_settled(self, message: Any) -> bool:
        ref = self._settled_messages.get(id(message))
        return ref is not None and ref() is message

    async def settle(
        self, message: Any, decision: Decision, operation: str, *, applied: bool = False
    ) -> Handout:
        """Settle a message this receiver handed out: its region loop records ``decision``
        in the seen-set, then settles the copy in its region (and its twin in the other).
        Returns once the loop has the decision, without waiting for either (see the module
        doc); with ``applied``, once its region settled it (or failed to). A copy without
        a dedup key has nothing to record: the call returns once its region settled it.

        ``applied`` is for a decision the application may act on at the broker next: a
        deferred message is received by its number, which the region knows only once it
        deferred it.

        Returns:
            The message's handout (its region).

        Raises:
            ConfigurationError, SettlementError: As :meth:`handout`.
            ClosedError: The receiver was closed.
        """
        self._check_open()
        handout = self.handout(message, operation)
        handout.decided.set_result(decision)
        if decision.settle is Settle.ABANDON and not decision.returned and not self.prefetch:
            await self._abandon_in_order(handout)
            return handout
        if handout.key is not None and not applied:
            # As the SDK's complete_message sends its disposition and returns without the
            # broker's answer. One step of the loop: the handler waiting for the decision
            # takes it to its region loop, which records it with the others that came
            # meanwhile (one seen-set call for a puller's run of completions).
            await asyncio.sleep(0)
            return handout
        if handout.key is None:
            await asyncio.wait([handout.settled])
        if applied and not handout.settled.done():
            # The region's call has its own deadline; this bound is for a loop that ended.
            with contextlib.suppress(TimeoutError), self._clock.deadline(CALL_SECONDS + 1.0):
                await asyncio.wait([handout.settled])
        if not handout.settled.done():
            return handout
        error = handout.settled.result()
        if error is not None:
            _log.warning(
                "%s: %s could not settle the copy (%s); its outcome is recorded, so the "
                "redelivered copy gets it without being handed out",
                operation,
                handout.region,
                type(error).__name__,
            )
        return handout

    async def _abandon_in_order(self, handout: Handout) -> None:
        """Abandon as the SDK's receiver without prefetch does: the message goes back to the
        head of its region (of its session) and the next receive gets it again, before the
        messages behind it.

        What this receiver fetched ahead and has not handed out (the read-ahead, the
        other region's copies) would otherwise be handed out first: a session's next
        message before the abandoned one. So those copies go back unseen (the ``released``
        outcome, not a delivery attempt), and the call returns once the abandon and the
        hand-backs reached their regions (at most :data:`ABANDON_WAIT`), handing back too
        whatever a receive that began before then brings.
        """
        waits = [handout.settled, *self._return_buffered()]
        with contextlib.suppress(TimeoutError), self._clock.deadline(ABANDON_WAIT):
            while waits:
                await asyncio.wait(waits)
                self._epoch += 1
                waits = self._return_buffered()
                if not waits and any(f.arriving for f in self._fetches.values()):
                    await self._wait_for_arrival(BUSY_POLL)  # a receive's claims under way
                    waits = self._return_buffered()
        self._epoch += 1

    def _return_buffered(self) -> list[asyncio.Future[BaseException | None]]:
        """Hand back unseen every copy in the buffer; the futures of their settlements."""
        returned = [h for h in self._buffer if not h.decided.done()]
        self._buffer.clear()
        for waiting in returned:
            waiting.decided.set_result(RETURNED)
        return [h.settled for h in returned]

    async def renew_lock(self, message: Any) -> float | None:
        """Renew the lock of a message handed out; its new expiry (epoch seconds) if known.

        Raises:
            SettlementError: Not a message this receiver holds.
            RegionError: The region refused or did not answer (``LOCK_LOST``...).
        """
        self._check_open()
        handout = self.handout(message, "renew_message_lock")
        probe = self._fetches[handout.region].probe
        with bounded_call(self._clock, handout.region, "a lock renewal"):
            return await probe.renew_lock(message)

    def _settled(
        self, probe: SettleProbe, message: Any, error: BaseException | None, operation: str
    ) -> None:
        handout = self._held.pop(id(message), None)
        if handout is not None:
            with contextlib.suppress(TypeError):  # a message type without weak references
                self._settled_messages[id(message)] = weakref.ref(message)
                if len(self._settled_messages) > SETTLED_REMEMBERED:
                    self._settled_messages.popitem(last=False)
            if not handout.settled.done():
                handout.settled.set_result(error)
            return
        if operation == "defer" and error is None and self._on_twin_deferred is not None:
            policy = self.geo.dedup_key
            key = probe.delivery(message, policy.source, policy.name).key
            if key is not None:
                self._on_twin_deferred(key, probe.region, message)

    async def _handle(self, fetch: _Fetch, message: Any, *, sweeping: bool = False) -> None:
        """The GeoReceiver's handler: hand the message out, wait for the decision.

        A copy a sweep took whose key was not final (the final ones at the head were
        locked by another receiver, and the receive took the next ones) is handed back
        unseen unless the application has room for it: a sweep settles twins, it does not
        claim messages nobody asked for (three competing receivers each held 100 to 200
        claims that way, all waiting for their lease after a crash).
        """
        batch = self._arrivals.pop(id(message), None)
        if batch is not None:
            batch.arrived([id(message)])
        if batch is not None and id(message) in batch.keys:
            key = batch.keys[id(message)]
        else:
            policy = self.geo.dedup_key
            key = fetch.probe.delivery(message, policy.source, policy.name).key
        loop = asyncio.get_running_loop()
        handout = Handout(
            message, fetch.probe.region, loop.create_future(), loop.create_future(), key=key
        )
        self._held[id(message)] = handout
        unasked = sweeping and self._room() <= 0
        fetch.swept_in_vain |= unasked
        # Received before an abandon reached its region: it may have come ahead of the
        # abandoned message, which the application must get first.
        stale = batch is not None and batch.epoch < self._epoch
        if self._closing or unasked or stale:
            handout.decided.set_result(RETURNED)
        else:
            self._buffer.append(handout)
            self._notify()
        decision = await handout.decided
        if decision.returned:
            await self.geo.hand_back(message)
        elif decision.settle is Settle.ABANDON:
            await self.geo.abandon_message(message)
        elif decision.settle is Settle.DEFER:
            await self.geo.defer_message(message)
        elif decision.settle is Settle.DEAD_LETTER:
            await self.geo.dead_letter_message(message, decision.reason, decision.description)

    def _room(self) -> int:
        """How many copies the buffer lacks of what is asked for, ``prefetch`` and the
        read-ahead (0 or less: none)."""
        return self._wanted + self.prefetch + self.read_ahead - len(self._buffer)

    # ------------------------------------------------------------------- fetching

    def _start_fetching(self) -> None:
        if self._started:
            return
        self._started = True
        for fetch in self._fetches.values():
            fetch.task = asyncio.ensure_future(self._fetch(fetch))

    async def _fetch(self, fetch: _Fetch) -> None:
        """One region's fetcher: receive what is asked for; sweep while idle."""
        failures = 0
        while not self._stop_fetching.is_set():
            # Cleared before the shortfall is read, not when idling starts: a request that
            # comes while this turn receives or sweeps then ends the idle at once.
            fetch.wake.clear()
            if self._buffer and self._idle_for(IDLE_RETURN) and not self._ordered:
                self._return_beyond(self.prefetch)
            shortfall = self._room() - fetch.arriving
            if shortfall <= 0 and fetch.chase and not fetch.arriving:
                shortfall, fetch.chase = fetch.chase, 0
            try:
                if shortfall > 0 and self._may_receive(fetch):
                    fetch.begun += 1
                    try:
                        received = await self._receive_into(fetch, shortfall)
                    finally:
                        fetch.rounds += 1
                        self._notify()
                    self._set_dry(fetch, not received)
                    if not received and fetch.held:
                        # Nothing new, and copies of ours there wait to be settled: leave
                        # the region's lock to them a moment before receiving again.
                        await self._idle(fetch, BUSY_POLL, wake=False)
                elif (due := self._frontier_due(fetch)) == 0.0 or self._may_sweep():
                    fetch.frontier = False
                    if not await self._sweep_once(fetch):
                        await self._idle(fetch, self.poll)
                else:
                    await self._idle(fetch, self.poll if due is None else due)
                failures = 0
                fetch.failing, fetch.failures, fetch.lock_lost = None, 0, False
            except (RegionError, StoreUnavailableError) as exc:
                if isinstance(exc, RegionError):
                    self._set_dry(fetch, True)
                    fetch.failing = exc
                    fetch.lock_lost = fetch.lock_lost or exc.kind is ErrorKind.LOCK_LOST
                    fetch.failures += 1
                    fetch.failed_total += 1
                    self._notify()  # a receive waiting may have to raise it
                failures += 1
                _log.warning("receive from %s failed: %s", fetch.probe.region, exc)
                await self._idle(fetch, min(0.1 * 2**failures, _BACKOFF_MAX), wake=False)
            except Exception:
                # Never silently: a fetcher that died would leave its region unread.
                failures += 1
                _log.exception("the %s fetcher failed; retrying", fetch.probe.region)
                await self._idle(fetch, min(0.1 * 2**failures, _BACKOFF_MAX), wake=False)

    def _idle_for(self, seconds: float) -> bool:
        """Whether no receive call is under way and the last returned ``seconds`` ago."""
        returned = self._returned_at
        return (
            self._wanted == 0
            and returned is not None
            and self._clock.monotonic() - returned >= seconds
        )

    def _return_beyond(self, keep: int) -> None:
        """Hand back unseen the copies in the buffer after its first ``keep`` (the newest:
        the buffer's head is handed out first), and read ahead no more until the next
        call (else the fetchers would fetch them again at once, and hand them back a
        second later, for as long as the program does not ask)."""
        self.read_ahead = 0
        while len(self._buffer) > keep:
            handout = self._buffer.pop()
            if not handout.decided.done():
                handout.decided.set_result(RETURNED)

    def _may_sweep(self) -> bool:
        """Whether an idle fetcher sweeps now: not while the application is between two
        receive calls (within :data:`SWEEP_AFTER` of the last one's return), unless the
        regions are read one at a time (``ordered``: the others are only swept)."""
        if not self._sweep:
            return False
        returned = self._returned_at
        if self._ordered or returned is None:
            return True
        return self._clock.monotonic() - returned >= SWEEP_AFTER

    def _frontier_due(self, fetch: _Fetch) -> float | None:
        """Seconds until ``fetch``'s frontier sweep (:attr:`_Fetch.frontier`) is due, 0 if
        now; None without one. Due once the application has not asked for
        :data:`KEEPING_UP`: while it keeps asking, the receives take the twins anyway (a
        sweep's browse decodes 32 messages: one per turn cost a tenth of the client's CPU)."""
        if not (fetch.frontier and self._sweep):
            return None
        returned = self._returned_at
        if returned is None:
            return 0.0
        wait = returned + KEEPING_UP - self._clock.monotonic()
        # Under a millisecond is now: a wait of 1e-17 s would end where it began, and the
        # fetcher would go round without time passing.
        return wait if wait >= 0.001 else 0.0

    def _may_receive(self, fetch: _Fetch) -> bool:
        """Whether ``fetch`` may receive what is asked for now (``ordered``: every region
        before it came back empty or failed)."""
        if not self._ordered:
            return True
        for other in self._fetches.values():
            if other is fetch:
                return True
            if not other.dry:
                return False
        return True

    def _set_dry(self, fetch: _Fetch, dry: bool) -> None:
        if dry != fetch.dry:
            fetch.dry = dry
            if self._ordered:
                self._wake_fetchers()

    async def _idle(self, fetch: _Fetch, seconds: float, *, wake: bool = True) -> None:
        """Wait ``seconds``, less when stopping (or, with ``wake``, when asked for more
        since this turn of the fetcher began)."""
        events = [self._stop_fetching.wait()]
        if wake:
            events.append(fetch.wake.wait())
        waits = [asyncio.ensure_future(e) for e in events]
        try:
            with self._clock.deadline(seconds):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            pass
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _receive_into(self, fetch: _Fetch, count: int, *, sweeping: bool = False) -> int:
        """Receive up to ``count`` copies and start taking them to their outcomes.

        Returns:
            How many copies were received.

        Raises:
            RegionError: The region failed or did not answer in time.
        """
        # A receive holds the region's lock while it waits: with copies of ours there to
        # settle (twins waiting for their outcome), wait briefly and let them through.
        wait = min(self.poll, BUSY_POLL) if fetch.held else self.poll
        epoch = self._epoch
        copies = await fetch.loop.receive_copies(count, wait)
        if copies:
            self._start_turns(fetch, copies, sweeping=sweeping, epoch=epoch)
        return len(copies)

    def _start_turns(
        self, fetch: _Fetch, copies: list[Copy], *, sweeping: bool = False, epoch: int | None = None
    ) -> asyncio.Task[bool]:
        batch = _Batch(
            fetch,
            {id(c.message) for c in copies},
            {id(c.message): c.delivery.key for c in copies},
            epoch=self._epoch if epoch is None else epoch,
        )
        fetch.arriving += len(batch.expected)
        held = [self.geo.seen_key(c.delivery.key) for c in copies if c.delivery.key is not None]
        fetch.held.update(held)
        for message_id in batch.expected:
            self._arrivals[message_id] = batch

        def claimed(processing: list[Copy], twins: int) -> None:
            going = {id(c.message) for c in processing}
            others = [m for m in batch.expected if m not in going]
            for message_id in others:
                self._arrivals.pop(message_id, None)
            batch.arrived(others)
            batch.handed = bool(going)
            all_twins = twins == len(copies) and not sweeping
            fetch.chase = min(2 * twins, CHASE_MOST) if all_twins else 0
            if fetch.chase:
                fetch.wake.set()

        handler = partial(self._handle, fetch, sweeping=sweeping)
        task = asyncio.ensure_future(fetch.loop.process_copies(handler, copies, on_claimed=claimed))
        self._turns.add(task)

        def done(finished: asyncio.Task[bool]) -> None:
            self._turns.discard(finished)
            fetch.held.subtract(held)
            fetch.held += Counter()  # drops the keys no longer held
            for message_id in list(batch.expected):
                self._arrivals.pop(message_id, None)
            batch.arrived(list(batch.expected))
            if finished.cancelled():
                return
            if finished.exception() is not None:
                _log.error(
                    "taking copies from %s to their outcomes failed: %r",
                    fetch.probe.region,
                    finished.exception(),
                )
            elif finished.result():
                # Twins only: this region is behind the other, and what follows them here
                # may be twins too. Messages handed out: the twins of those in a region
                # that is behind are final now.
                fetch.behind = not batch.handed
                for other in self._fetches.values():
                    if other.behind and (other is fetch or batch.handed):
                        other.frontier = True
                        if not sweeping:  # a sweep's own pause stands (no sweep at once
                            other.wake.set()  # again over copies it could not take)

        task.add_done_callback(done)
        return task

    async def _sweep_once(self, fetch: _Fetch) -> bool:
        """Receive (and so settle) the copies at the head of an idle region whose key is
        final already; True if there were any.

        Raises:
            RegionError: The region failed or did not answer in time.
        """
        count = await self._final_at_head(fetch)
        if not count:
            return False
        if not await self._receive_into(fetch, count, sweeping=True):
            return False
        # Final copies at the head may be locked by another receiver (its twins, parked
        # there): the receive then took later copies, handed back at once. Pauses keep
        # such a sweep from taking them again and again (a request ends them at once):
        # a short one, then the poll interval once a copy went back.
        await self._idle(fetch, BUSY_POLL)
        if fetch.swept_in_vain:
            fetch.swept_in_vain = False
            await self._idle(fetch, self.poll)
        return True

    async def _final_at_head(self, fetch: _Fetch) -> int:
        """How many receivable copies at the head of the region have a final key.

        Deferred copies seen on the way whose key is final (processed or dead-lettered
        since, from the other region) go to ``settle_deferred``, if given: a receive never
        takes them, so nothing else would.
        """
        loop = fetch.loop
        peeked = await loop.peek(_SWEEP_PEEK)
        policy = self.geo.dedup_key
        keys: list[str] = []
        deferred: list[tuple[Any, str]] = []
        head_ended = False
        for message in peeked:
            state = getattr(message, "state", None)
            key = fetch.probe.delivery(message, policy.source, policy.name).key
            if state is not None and int(state) == _DEFERRED:
                if key is not None and self._settle_deferred is not None:
                    deferred.append((message, self.geo.seen_key(key)))
                continue
            if head_ended or (state is not None and int(state) != _ACTIVE):
                continue  # scheduled: not received yet
            if key is None:
                head_ended = True
                continue
            seen_key = self.geo.seen_key(key)
            if fetch.held[seen_key] > 0:
                continue  # locked by this receiver: a receive passes over it
            keys.append(seen_key)
        if not keys and not deferred:
            return 0
        states = await self.geo.seen.peek(keys + [key for _, key in deferred])
        final = 0
        for state in states[: len(keys)]:
            if state not in FINAL_STATES:
                break
            final += 1
        settled: list[tuple[Any, ClaimState]] = [
            (message, state)
            for (message, _), state in zip(deferred, states[len(keys) :], strict=True)
            if state in (ClaimState.DONE, ClaimState.DEAD_LETTERED)
        ]
        if settled and self._settle_deferred is not None:
            await self._settle_deferred(fetch.probe, settled)
        return final

    # ------------------------------------------------------------------- closing

    async def _close(self) -> None:
        self._closing = True
        self._notify()
        pending = [*self._held.values(), *self._buffer]
        self._buffer.clear()
        for handout in pending:
            if not handout.decided.done():
                # One the application has is abandoned as the SDK's lock would lapse (a
                # delivery); one it never got goes back without counting as an attempt.
                handout.decided.set_result(ABANDON if handout.handed_out else RETURNED)
        self._stop_fetching.set()
        await stop_tasks([task for task in self._opening if not task.done()], clock=self._clock)
        fetchers = [f.task for f in self._fetches.values() if f.task is not None]
        await self._bounded(fetchers, self.poll + RECEIVE_GRACE, "fetcher")
        settling = [h.settled for h in pending]
        await self._bounded(settling, CALL_SECONDS + 1.0, "settlement", cancel=False)
        # Copies parked behind a copy just settled in the other region find its outcome on
        # their next claim (at most a second apart): let them settle rather than be
        # handed back, which would leave them in their region.
        await self._bounded(list(self._turns), 2 * self.poll + 1.0, "parked copy", cancel=False)
        if self._sweep and self._started:
            await self._final_sweep()
        await self.geo.aclose()  # its loops hand back the copies they still hold
        await self._bounded(list(self._turns), self.geo.lease + self.poll, "receive turn")
        await close_all(
            self._owned, timeout=self.geo.close_timeout, clock=self._clock, what="region receiver"
        )
        for handout in self._held.values():  # a settlement the closing cut short
            if not handout.settled.done():
                handout.settled.set_result(ClosedError("the receiver closed first"))
        self._held.clear()

    async def _final_sweep(self) -> None:
        """Settle what each region holds at its head that is final already (bounded)."""

        async def sweep(fetch: _Fetch) -> None:
            try:
                with self._clock.deadline(self.poll + RECEIVE_GRACE):
                    count = await self._final_at_head(fetch)
                    if count:
                        copies = await fetch.loop.receive_copies(count)
                        if copies:
                            # Shielded: a turn cut short could leave a claim unreleased;
                            # one still running is waited for (bounded) below.
                            await asyncio.shield(self._start_turns(fetch, copies))
            except (RegionError, TimeoutError) as exc:
                _log.debug("closing: sweeping %s failed: %r", fetch.probe.region, exc)
            except Exception as exc:
                _log.warning("closing: sweeping %s failed: %r", fetch.probe.region, exc)

        await asyncio.gather(*(sweep(f) for f in self._fetches.values()))

    async def _bounded(
        self,
        waits: Sequence[asyncio.Future[Any]],
        seconds: float,
        what: str,
        *,
        cancel: bool = True,
    ) -> None:
        """Wait for ``waits`` at most ``seconds``; then cancel (or leave) the rest."""
        if not waits:
            return
        gathered = asyncio.gather(*waits, return_exceptions=True)
        try:
            with self._clock.deadline(seconds):
                await asyncio.shield(gathered)
        except TimeoutError:
            pass
        late = [w for w in waits if not w.done()]
        if late:
            _log.warning("closing: %d %s(s) did not finish within %g s", len(late), what, seconds)
            if cancel:
                await stop_tasks(late, clock=self._clock)
