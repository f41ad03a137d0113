"""The outbox drainer: sends what the durable outbox holds once a region answers again.

One :class:`OutboxDrainer` per GeoSender. Its promises (docs/sender.md, "The outbox"):

* An entry is deleted as soon as a region accepted it, so a crash re-sends at most the
  entry in flight. One whose delete fails (a full disk, a file locked by another process)
  is never sent again by this drainer: it stays leased to it, and each later drain deletes
  it before sending anything else.
* Before every send the lease on the entries still to send is renewed so that it outlives
  the send: a second drainer on the same file never takes over an entry this one is
  sending (unless this process stalls for longer than the lease).
* Only "no region could be reached" backs a target off. An entry refused for what it is
  (too large, invalid, refused credentials, missing entity...) is moved to the
  dead-letter table at once and never holds up the entries behind it; one refused for now
  (a retryable error that is not an outage, a full entity) is retried later on its own.
* A message whose time-to-live ran out while it waited is dropped as expired, never
  delivered late; one still alive is sent with what is left of its time-to-live.
* The drainer never dies: any error is logged, counted, and retried after a backoff.
"""

from __future__ import annotations

__all__ = [
    "DrainTelemetry",
    "OutboxDrainer",
    "is_unavailable",
    "is_worth_retrying",
    "refusal_reason",
]

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from georep._classify import TRY_LATER_KINDS
from georep._lifecycle import start_task, stop_task
from georep._policy import DrainPolicy, as_seconds
from georep._telemetry import Instruments, InstrumentSpec
from georep.exceptions import (
    AllRegionsUnavailableError,
    OutboxFullError,
    OutboxUnavailableError,
    RegionError,
)
from georep.ports import Clock, ErrorKind, MessageCodec, Outbox, OutboxEntry

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

    from georep.outbox.sessions import HeldSessions
    from georep.send.records import SendRecords

_log = logging.getLogger("georep.sender")


def is_unavailable(error: BaseException, kinds: Collection[ErrorKind]) -> bool:
    """True when ``error`` says "no region could be reached", not "this message is refused".

    Args:
        error: What a delivery attempt raised.
        kinds: The kinds that mean a region is unavailable (the failover policy's).
    """
    if isinstance(error, AllRegionsUnavailableError):
        causes = error.causes.values()
        return bool(causes) and all(is_unavailable(cause, kinds) for cause in causes)
    return isinstance(error, RegionError) and error.kind in kinds


def is_worth_retrying(error: BaseException) -> bool:
    """True when the same send may succeed later unchanged (a transient refusal)."""
    if isinstance(error, AllRegionsUnavailableError):
        return any(is_worth_retrying(cause) for cause in error.causes.values())
    return isinstance(error, RegionError) and (error.retryable or error.kind in TRY_LATER_KINDS)


def refusal_reason(error: BaseException) -> str:
    """How a dead-letter row names its cause: class and kind, never the text (secrets)."""
    kind = getattr(error, "kind", None)
    name = type(error).__name__
    return f"{name} ({kind.value})" if isinstance(kind, ErrorKind) else name


class DrainStats(Protocol):
    """The counters a drainer updates (a :class:`georep.SenderStats`)."""

    drained: int
    dead_lettered: int
    expired: int
    outbox_depth: int | None


DRAIN_COUNTERS: Final = {
    "dead_lettered": InstrumentSpec(
        "georep.outbox.dead_lettered",
        "{message}",
        "Outbox entries refused for good and moved to the dead-letter table.",
    ),
    "expired": InstrumentSpec(
        "georep.outbox.expired",
        "{message}",
        "Outbox entries dropped because their time-to-live ran out.",
    ),
    "error": InstrumentSpec(
        "georep.outbox.drainer_errors",
        "{error}",
        "Drain rounds that failed (the drainer backs off and goes on).",
    ),
}
"""The drainer's counters."""


class DrainTelemetry:
    """The counters the drainer records into (the shared per-provider instruments)."""

    def __init__(self, *, entity: str, meter_provider: MeterProvider | None) -> None:
        self._attributes = {"messaging.destination.name": entity}
        self._counters = Instruments.of(meter_provider).counters(DRAIN_COUNTERS)

    def dead_lettered(self) -> None:
        self._counters["dead_lettered"].add(1, self._attributes)

    def expired(self) -> None:
        self._counters["expired"].add(1, self._attributes)

    def error(self) -> None:
        self._counters["error"].add(1, self._attributes)


class _StuckSessions:
    """The sessions of a drain round whose earlier entry stays queued (and its target)."""

    __slots__ = ("_stuck",)

    def __init__(self) -> None:
        self._stuck: dict[str, set[str | None]] = {}

    def add(self, entries: Iterable[OutboxEntry]) -> None:
        for entry in entries:
            if entry.session_id is not None:
                self._stuck.setdefault(entry.session_id, set()).add(entry.region)

    def behind(self, entry: OutboxEntry) -> bool:
        """True when an earlier entry of ``entry``'s session, for a region it could also
        reach (the same, or either of them any region), stays queued."""
        regions = None if entry.session_id is None else self._stuck.get(entry.session_id)
        if not regions:
            return False
        return entry.region is None or None in regions or entry.region in regions


@dataclass(frozen=True, slots=True)
class _DrainTerms:
    """What an :class:`OutboxDrainer` drains, and how: fixed for its life (see its Args)."""

    outbox: Outbox
    channel: str
    codec: MessageCodec
    policy: DrainPolicy
    clock: Clock
    deliver: Callable[[str | None, Any], Awaitable[None]]
    unavailable_kinds: frozenset[ErrorKind]
    send_budget: float


class OutboxDrainer:
    """Drains one sender's channel of an outbox.

    Args:
        outbox: The store.
        channel: The sender's channel in it.
        codec: Decodes entries and adjusts their time-to-live.
        policy: Batch size, lease, backoff, idle interval.
        clock: Time source.
        deliver: Sends one decoded message to a target namespace (None = any region);
            raises what a send raises.
        unavailable_kinds: Error kinds that mean a region is down (back off, never
            dead-letter).
        send_budget: Most seconds one delivery can take (both regions' deadlines); the
            lease is renewed before each send so that it outlives this.
        telemetry: Counters.
        stats: The sender's counters (drained, dead-lettered, expired, depth).
        records: The sender's ledger rows, if it has a ledger (expired messages are
            recorded there, outcome ``expired``).
        held: The sender's view of the sessions the outbox holds, forgotten whenever the
            channel is seen empty.
    """

    def __init__(
        self,
        *,
        outbox: Outbox,
        channel: str,
        codec: MessageCodec,
        policy: DrainPolicy,
        clock: Clock,
        deliver: Callable[[str | None, Any], Awaitable[None]],
        unavailable_kinds: Collection[ErrorKind],
        send_budget: float,
        telemetry: DrainTelemetry,
        stats: DrainStats,
        records: SendRecords | None = None,
        held: HeldSessions | None = None,
    ) -> None:
        self._terms = _DrainTerms(
            outbox=outbox,
            channel=channel,
            codec=codec,
            policy=policy,
            clock=clock,
            deliver=deliver,
            unavailable_kinds=frozenset(unavailable_kinds),
            send_budget=send_budget,
        )
        self._telemetry = telemetry
        self._stats = stats
        self._records = records
        self._held = held
        # One owner per drainer: leases it lost to another drainer are never touched again.
        self.owner = f"georep-{uuid.uuid4().hex}"
        self.errors = 0
        """Drain rounds that failed since the drainer was created."""
        self._stopping = False
        self._has_work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._undeleted: set[int] = set()
        """Entries a region accepted whose delete failed: deleted before the next send,
        never sent again."""

    @property
    def running(self) -> bool:
        """True while the background task runs."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start draining in the background (idempotent)."""
        if self._task is None and not self._stopping:
            # start_task: should the loop itself ever crash, it is logged when it happens.
            self._task = start_task(self._run_forever(), name="georep-outbox-drainer")

    def wake(self) -> None:
        """Something was queued: check the outbox now rather than after the idle interval."""
        self._has_work.set()

    async def stop(self, *, timeout: float) -> None:
        """Stop gracefully: finish the entry in flight, hand the rest back, then return.

        Args:
            timeout: Seconds to wait for the round in progress. After it, the round is
                cancelled; its unsent entries are still released, and the one in flight
                (if any) may have been accepted: it can be sent once more later.
        """
        self._stopping = True
        self._has_work.set()
        task = self._task
        if task is None or task.done():
            return  # a drainer that crashed was logged when it did (start_task)
        # asyncio.wait: the deadline ends our wait, not the round; neither the drainer's
        # end nor its error is raised here, only the caller's own cancellation.
        with contextlib.suppress(TimeoutError), self._terms.clock.deadline(timeout):
            await asyncio.wait([task])
        if not task.done():
            _log.warning("outbox drainer did not finish within %.1f s; cancelling it", timeout)
            await stop_task(task, clock=self._terms.clock)

    async def drain_once(self) -> int:
        """Send everything due now; return how many entries were delivered."""
        terms = self._terms
        delivered = 0
        policy = terms.policy
        # Twice the send budget at least: renewed whenever less than one budget is left, a
        # renewal always leaves room for the next send.
        lease = max(as_seconds(policy.lease), 2 * terms.send_budget)
        await self._delete_undeleted()
        while not self._stopping:
            now = terms.clock.time()
            entries = await terms.outbox.claim(
                terms.channel, limit=policy.batch_size, now=now, lease=lease, owner=self.owner
            )
            if not entries:
                break
            sent, any_down = await self._round(entries, now + lease, lease)
            delivered += sent
            if any_down:
                break
        checkpoint = None if self._held is None else self._held.checkpoint()
        depth = await terms.outbox.depth(terms.channel)
        self._stats.outbox_depth = depth
        if depth == 0 and self._held is not None:
            self._held.forget(checkpoint)
        return delivered

    async def _round(
        self, entries: Sequence[OutboxEntry], leased_until: float, lease: float
    ) -> tuple[int, bool]:
        """Send claimed ``entries`` in order; return (delivered, some target was down).

        An entry whose session has an earlier entry in this round that stays behind (its
        region down, refused for now, its lease lost) is handed back unsent: a session
        never overtakes itself. The claim then holds it back until the earlier one is due.
        """
        terms = self._terms
        pending = list(entries)
        held_back: list[OutboxEntry] = []
        stuck = _StuckSessions()
        down: dict[str | None, int] = {}
        delivered = 0
        try:
            while pending and not self._stopping:
                now = terms.clock.time()
                if leased_until - now < terms.send_budget:
                    # Renew before sending, so the lease outlives this send.
                    held = set(
                        await terms.outbox.renew(
                            [e.entry_id for e in pending], owner=self.owner, now=now, lease=lease
                        )
                    )
                    leased_until = now + lease
                    stuck.add(e for e in pending if e.entry_id not in held)
                    pending = [e for e in pending if e.entry_id in held]
                    continue
                entry = pending[0]
                if stuck.behind(entry):
                    held_back.append(entry)
                elif entry.region in down:
                    down[entry.region] = max(down[entry.region], entry.attempts + 1)
                    await self._retry_later(entry, down[entry.region])
                    stuck.add([entry])
                else:
                    outcome = await self._attempt(entry, down)
                    if outcome:
                        delivered += 1
                    elif outcome is False:  # still queued: its session waits behind it
                        stuck.add([entry])
                pending.pop(0)
        finally:
            if pending or held_back:
                # Stopping, or cancelled: hand the unsent entries back at once (shielded, so
                # a cancellation does not leave them leased for the whole lease). An entry
                # accepted but not deleted stays leased: nobody may send it again.
                ids = [
                    e.entry_id for e in (*held_back, *pending) if e.entry_id not in self._undeleted
                ]
                with contextlib.suppress(Exception):
                    await asyncio.shield(terms.outbox.release(ids, owner=self.owner))
        return delivered, bool(down)

    async def _attempt(self, entry: OutboxEntry, down: dict[str | None, int]) -> bool | None:
        """Send one entry; settle it in the outbox.

        Returns:
            True when delivered; None when it left the queue undelivered (expired,
            dead-lettered: its session's next entries go on); False when it stays queued.
        """
        terms = self._terms
        try:
            message = terms.codec.decode(entry.payload)
            if self._expire(entry, message):
                await terms.outbox.delete([entry.entry_id])
                return None
            await terms.deliver(entry.region, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if is_unavailable(exc, terms.unavailable_kinds):
                # The target is down: its other entries in this round back off too.
                down[entry.region] = entry.attempts + 1
                _log.warning(
                    "outbox: %s still unavailable (%s); backing off",
                    entry.region or "every region",
                    refusal_reason(exc),
                )
                await self._retry_later(entry, entry.attempts + 1)
            elif is_worth_retrying(exc):
                # A transient refusal of this entry: retried later, the others go on.
                _log.warning(
                    "outbox entry %d refused for now (%s); retrying it later",
                    entry.entry_id,
                    refusal_reason(exc),
                )
                await self._retry_later(entry, entry.attempts + 1)
            else:
                await self._dead_letter(entry, exc)
                return None
            return False
        self._stats.drained += 1
        # Deleted at once: a crash from here on re-sends nothing that was accepted.
        await self._delete_accepted(entry.entry_id)
        return True

    async def _delete_accepted(self, entry_id: int) -> None:
        """Delete an accepted entry, retrying a few times: one left behind would be sent
        twice. Should the store still refuse, the entry is remembered (never sent again by
        this drainer, deleted first by the next drain) and the store's error raised: the
        drain pauses until the store answers (a full disk, a locked file)."""
        self._undeleted.add(entry_id)
        for pause in (0.05, 0.2, 1.0):
            try:
                await self._delete_undeleted()
                return
            except Exception as exc:
                _log.warning(
                    "outbox: deleting accepted entry %d failed (%s); retrying in %.2f s",
                    entry_id,
                    type(exc).__name__,
                    pause,
                )
                await self._terms.clock.sleep(pause)
        await self._delete_undeleted()

    async def _delete_undeleted(self) -> None:
        """Delete the accepted entries whose delete failed before.

        Raises:
            Exception: The store's error; they stay remembered.
        """
        if self._undeleted:
            await self._terms.outbox.delete(sorted(self._undeleted))
            self._undeleted.clear()

    def _expire(self, entry: OutboxEntry, message: Any) -> bool:
        """Shorten the message's time-to-live by its wait; True when nothing is left."""
        terms = self._terms
        ttl = terms.codec.time_to_live(message)
        if ttl is None:
            return False
        now = terms.clock.time()
        left = ttl - max(0.0, now - entry.enqueued_at)
        if left > 0:
            terms.codec.set_time_to_live(message, left)
            return False
        self._stats.expired += 1
        self._telemetry.expired()
        message_id = terms.codec.message_id(message) or ""
        _log.warning(
            "outbox entry %d (message %s) expired after waiting %.1f s (time-to-live %.1f s); "
            "dropped, not delivered late",
            entry.entry_id,
            message_id,
            now - entry.enqueued_at,
            ttl,
        )
        if self._records is not None:
            self._records.expired(message_id, now)
        return True

    async def _retry_later(self, entry: OutboxEntry, attempts: int) -> None:
        terms = self._terms
        await terms.outbox.retry_later(
            [entry.entry_id],
            not_before=terms.clock.time() + terms.policy.backoff(attempts),
            owner=self.owner,
        )

    async def _dead_letter(self, entry: OutboxEntry, error: BaseException) -> None:
        reason = refusal_reason(error)
        _log.error(
            "outbox entry %d refused for good (%s) after %d attempt(s); moved to the "
            "dead-letter table (georep outbox list|replay|purge)",
            entry.entry_id,
            reason,
            entry.attempts + 1,
        )
        await self._terms.outbox.dead_letter(
            [(entry.entry_id, reason)], now=self._terms.clock.time()
        )
        self._stats.dead_lettered += 1
        self._telemetry.dead_lettered()

    async def _run_forever(self) -> None:
        terms = self._terms
        idle = as_seconds(terms.policy.idle_interval)
        failures = 0
        while not self._stopping:
            # Cleared before the drain, not after: an entry queued while it drains (its
            # wake() then) is drained next, not after the idle interval.
            self._has_work.clear()
            try:
                await self.drain_once()
                failures, pause = 0, idle
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the drainer die: it holds acknowledged messages
                failures += 1
                pause = terms.policy.backoff(failures)
                self.errors += 1
                self._telemetry.error()
                if isinstance(exc, OutboxFullError | OutboxUnavailableError):
                    # A full disk, a file locked by another process: the store's own words
                    # say what and what to do; a traceback adds nothing.
                    _log.warning("outbox drainer paused: %s; retrying in %.1f s", exc, pause)
                else:
                    _log.exception("outbox drainer failed; retrying in %.1f s", pause)
            if self._stopping:
                break
            if failures:
                self._has_work.clear()  # a failed drain backs off, whatever was queued
            with contextlib.suppress(TimeoutError), terms.clock.deadline(pause):
                await self._has_work.wait()
