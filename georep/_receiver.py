"""GeoReceiver: read both regions, hand each logical message to the handler once (SPEC §2.4).

Each region has one loop, and only that loop touches the region's receiver (the SDK's
receivers are not safe for concurrent calls). A turn of the loop:

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

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from georep._clock import SystemClock
from georep._outcomes import (
    ABANDON,
    COMPLETE,
    LEDGER_OUTCOMES,
    Decision,
    Decisions,
    Settle,
    dead_letter_decision,
    max_attempts_decision,
)
from georep._policy import DedupKey, Seconds, count, positive_seconds, seconds
from georep._settle import Copy, Settlements
from georep._telemetry import ReceiverMetrics, TracingGate
from georep.exceptions import (
    ClosedError,
    ConfigurationError,
    RegionError,
    RegionUnavailableError,
    SettlementError,
    StoreUnavailableError,
)
from georep.ports import (
    FINAL_STATES,
    Claims,
    ClaimState,
    Clock,
    ErrorKind,
    Ledger,
    RegionReceiver,
    SeenStore,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["GeoReceiver", "ReceiverHandler", "ReceiverStats", "receiver"]

_log = logging.getLogger("georep.receiver")

#: Seconds a receive call may take beyond ``max_wait`` (opening a link, a slow answer)
#: before georep gives up on it: the SDK alone can wait forever on a lost link.
RECEIVE_GRACE = 10.0
_propagator = TraceContextTextMapPropagator()

Handler = Callable[[Any], Awaitable[object]]
StorePolicy = Literal["pause", "process"]


@dataclass(slots=True)
class ReceiverStats:
    """Live counters of one GeoReceiver.

    Attributes:
        processed: Copies whose handler succeeded (each is one logical message).
        suppressed: Duplicate copies settled without calling the handler, by region.
        failed: Handler failures: it raised or abandoned the copy (abandoned for
            redelivery, or dead-lettered once ``max_attempts`` is reached).
        dead_lettered: Copies dead-lettered: by the handler, after ``max_attempts``, or
            as the twin of a copy dead-lettered in the other region.
        deferred: Copies deferred: by the handler, or as the twin of a deferred copy.
        pings: The paired namespaces' ping messages completed without the handler.
        parked: Copies now waiting for another consumer's outcome.
        in_flight: Handlers running now.
        store_errors: Seen-set calls that failed (Redis unreachable).
        unchecked: Copies processed without a dedup check (``on_store_unavailable="process"``
            or a copy without a dedup key).
        received: Copies received, by region.
    """

    processed: int = 0
    suppressed: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    dead_lettered: int = 0
    deferred: int = 0
    pings: int = 0
    parked: int = 0
    in_flight: int = 0
    store_errors: int = 0
    unchecked: int = 0
    received: dict[str, int] = field(default_factory=dict)


def _as_region_receiver(receiver: Any, region: str) -> RegionReceiver:
    if isinstance(receiver, RegionReceiver):
        return receiver
    try:
        from georep._sdk import region_receiver_for
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            f"{region} receiver is a {type(receiver).__name__}; wrapping an SDK receiver "
            "needs pip install 'georep[servicebus]'"
        ) from exc
    # Async SDK receivers run on the loop, sync ones on a worker thread per SDK receiver.
    wrapped: RegionReceiver = region_receiver_for(receiver, region=region)
    return wrapped


def _observed_parked(receiver: GeoReceiver) -> int | None:
    """The parked count the gauge reports for ``receiver``: none once it is closed."""
    return None if receiver._closed else receiver.stats.parked


class GeoReceiver:
    """Receive from a queue (or subscription) in two regions; process each message once.

    Wraps two existing ``azure.servicebus.aio.ServiceBusReceiver`` objects in PEEK_LOCK
    mode (the caller keeps owning them; see :meth:`from_connection_strings` for a
    GeoReceiver that owns its clients). Duplicates (the twin from the other region, a
    redelivery after a lost settlement) are suppressed through the shared seen-set.

    Delivery is at-least-once with duplicates suppressed: a key is marked done only after
    its handler succeeded, so a consumer that dies mid-handler loses nothing (its lease
    expires and the message is processed again elsewhere).

    Args:
        primary: The primary region's receiver (SDK receiver or RegionReceiver).
        secondary: The secondary region's receiver.
        seen: The shared seen-set (e.g. ``georep.adapters.redis.RedisSeenSet``).
        dedup_key: The field that identifies a logical message (as the sender's).
        concurrency: Handlers running at once per region, and copies received per turn.
        lease: Seconds a claim lasts unless renewed; renewed while the handler runs.
        max_wait: Seconds one receive call waits for copies when the entity is idle.
        on_store_unavailable: ``"pause"`` (default): hand out nothing while the seen-set
            is unreachable, keep the copies locked, retry with backoff. ``"process"``:
            process without the dedup check (availability over exactly-once).
        owner: This consumer's identity in the seen-set (default: host, pid and a UUID).
        dedup_scope: What the copies are copies *of*: seen-set keys are scoped by it, so
            the subscriptions of one topic never look like duplicates of each other.
            Default: the entity path (queue, or ``topic/Subscriptions/name``), lower-cased
            (Service Bus names are case-insensitive); both regions' receivers must read
            the same path. Set it (the same string on every GeoReceiver of the entity)
            when the entity is named differently in the two regions.
        max_attempts: Handler failures (it raised or abandoned the copy) after which a
            copy is dead-lettered (reason ``georep:max-attempts``) instead of abandoned
            again; counted by the broker's delivery count of that copy. Default 10,
            Service Bus's default max delivery count: georep does not read the entity's
            (that needs Manage rights). Keep it at or below the entity's, so georep, not
            the broker, dead-letters the copy and records it for the twin.
        close_timeout: Seconds :meth:`aclose` waits for the clients it owns to close
            (closed concurrently). Default 5.0.
        ledger: Record one row per copy received (e.g. :class:`georep.ParquetLedger`): which
            region, processed, suppressed or failed, and when. The caller owns it:
            :meth:`aclose` flushes it but does not close it.
        clock: Time source (tests inject :class:`georep.testing.FakeClock`).
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    Raises:
        ConfigurationError: A setting is out of range, or the two regions' receivers read
            different entities and no ``dedup_scope`` says they are one.
    """

    def __init__(
        self,
        primary: Any,
        secondary: Any,
        *,
        seen: SeenStore,
        dedup_key: DedupKey = DedupKey.MESSAGE_ID,
        concurrency: int = 32,
        lease: Seconds = 60.0,
        max_wait: Seconds = 1.0,
        on_store_unavailable: StorePolicy = "pause",
        owner: str | None = None,
        dedup_scope: str | None = None,
        max_attempts: int = 10,
        close_timeout: Seconds = 5.0,
        ledger: Ledger | None = None,
        clock: Clock | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        count(concurrency, "concurrency")
        self.max_attempts = count(max_attempts, "max_attempts")
        self.close_timeout = positive_seconds(close_timeout, "close_timeout")
        if on_store_unavailable not in ("pause", "process"):
            raise ConfigurationError(
                f"on_store_unavailable must be 'pause' or 'process', not {on_store_unavailable!r}"
            )
        self.seen = seen
        self.dedup_key = dedup_key
        self.concurrency = concurrency
        self.lease = seconds(lease, "lease")
        self.max_wait = seconds(max_wait, "max_wait")
        if self.lease <= 0:
            raise ConfigurationError("lease must be greater than 0 seconds")
        self.on_store_unavailable = on_store_unavailable
        self.ledger = ledger
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._clock: Clock = clock or SystemClock()
        self._regions = [
            _as_region_receiver(primary, "primary"),
            _as_region_receiver(secondary, "secondary"),
        ]
        self.entity = self._regions[0].entity
        self.dedup_scope = _dedup_scope(self._regions, dedup_scope)
        self._scope_prefix = self.dedup_scope + "\n"
        self._decisions = Decisions()
        # One owner per region loop: the twin in the other region must not find "our"
        # claim and process the message a second time.
        self._owners = {r.region: f"{self.owner}/{r.region}" for r in self._regions}
        self.stats = ReceiverStats()
        self._metrics = ReceiverMetrics(self.entity, meter_provider, self, _observed_parked)
        self._settlements = Settlements(
            entity=self.entity,
            stats=self.stats,
            metrics=self._metrics,
            ledger=ledger,
            clock=self._clock,
            tracer=trace.get_tracer("georep", None, tracer_provider),
            tracing=TracingGate(tracer_provider, self._clock.monotonic),
        )
        # Adapters georep made around the caller's SDK receivers are georep's to close: that
        # stops their worker threads (sync receivers) and never closes the caller's receiver.
        self._owned: list[Any] = [
            adapter
            for adapter, given in zip(self._regions, (primary, secondary), strict=True)
            if adapter is not given
        ]
        self._stopping = asyncio.Event()
        self._closed = False
        self._running: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._parked: dict[str, int] = {}
        self._handler: Handler | None = None

    @classmethod
    def from_connection_strings(
        cls,
        primary: str,
        secondary: str,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        subscription_name: str | None = None,
        prefetch_count: int = 0,
        **kwargs: Any,
    ) -> GeoReceiver:
        """A GeoReceiver that creates, and closes, its own clients and receivers.

        Name a queue, or a topic and subscription. ``prefetch_count`` is passed to the SDK
        (default 0: georep asks for exactly what it can process, so nothing sits locked in
        a buffer when the receiver stops).

        Raises:
            ConfigurationError: A connection string is malformed or the entity is not
                named properly. The message never contains the key.
        """
        from georep._sdk import open_region_receiver

        if (queue_name is None) == (topic_name is None) or (
            topic_name is not None and subscription_name is None
        ):
            raise ConfigurationError(
                "name a queue (queue_name=) or a topic and subscription "
                "(topic_name=, subscription_name=)"
            )
        regions = [
            open_region_receiver(
                connection_string,
                region=region,
                queue_name=queue_name,
                topic_name=topic_name,
                subscription_name=subscription_name,
                prefetch_count=prefetch_count,
            )
            for region, connection_string in (("primary", primary), ("secondary", secondary))
        ]
        receiver = cls(regions[0], regions[1], **kwargs)
        receiver._owned.extend(regions)
        return receiver

    # ------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        if self._closed:
            raise ClosedError("this GeoReceiver is closed; create a new one")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def run(self, handler: Handler) -> None:
        """Receive and process until :meth:`aclose` (or cancellation).

        Args:
            handler: ``async def handler(message)``. Returning means "processed" (the
                copy is completed), raising means "not processed" (abandoned and
                redelivered, dead-lettered on its ``max_attempts``-th delivery). It may
                decide otherwise with :meth:`complete_message`, :meth:`abandon_message`,
                :meth:`defer_message` or :meth:`dead_letter_message` on the message it
                was given (never with the SDK's own settle methods).

        Raises:
            ClosedError: The receiver was closed.
        """
        if self._closed:
            raise ClosedError("this GeoReceiver is closed; create a new one")
        if self._running is not None:
            raise RuntimeError("this GeoReceiver is already running")
        self._handler = handler
        self._running = asyncio.current_task()
        self._stopped.clear()
        try:
            await asyncio.gather(*(self._region_loop(region) for region in self._regions))
        finally:
            self._running = None
            self._stopped.set()

    async def aclose(self) -> None:
        """Stop fetching, finish in-flight handlers, settle, and close owned clients.

        Idempotent. Copies parked waiting for another consumer are abandoned (redelivered
        at once rather than when their locks expire). A ledger is flushed, not closed.
        """
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        running = self._running
        if running is not None and running is not asyncio.current_task():
            await self._wait_for_loop(running)
        await self._close_owned()
        if self.ledger is not None:
            with contextlib.suppress(Exception):
                await self.ledger.flush()

    async def _wait_for_loop(self, running: asyncio.Task[Any]) -> None:
        """Let the region loops finish their handlers and settle, for at most a lease (a
        handler running longer has lost its claim anyway); then cancel them."""
        try:
            with self._clock.deadline(self.lease + self.max_wait):
                await asyncio.shield(self._stopped.wait())
        except TimeoutError:
            _log.warning(
                "the receive loops did not stop within %g s; cancelling them (copies not "
                "settled are redelivered when their locks expire)",
                self.lease + self.max_wait,
            )
            running.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(self._stopped.wait())

    async def _receive(self, region: RegionReceiver, room: int) -> list[Any]:
        """One receive call, bounded by georep's own deadline.

        The SDK can wait forever on a link lost under it; without this bound the region's
        loop (and :meth:`aclose`, which waits for it) would hang.

        Raises:
            RegionError: The region failed, or did not answer within ``max_wait`` plus
                :data:`RECEIVE_GRACE` seconds (kind TIMEOUT).
        """
        bound = self.max_wait + RECEIVE_GRACE
        try:
            with self._clock.deadline(bound):
                async with self._settlements.lock(region):
                    return await region.receive(room, max_wait=self.max_wait)
        except TimeoutError:
            raise RegionUnavailableError(
                f"{region.region}: a receive did not return within {bound:g} s",
                region=region.region,
                kind=ErrorKind.TIMEOUT,
            ) from None

    async def peek_all(self, count: int) -> dict[str, list[Any]]:
        """Up to ``count`` messages from each region, without locking them.

        Loops past short answers (a partitioned entity answers one fragment at a time), so
        each list is ``count`` long unless the region holds fewer.

        Returns:
            The peeked messages per region label.
        """
        peeked: dict[str, list[Any]] = {}
        for region in self._regions:
            async with self._settlements.lock(region):
                peeked[region.region] = await region.peek(count)
        return peeked

    def seen_key(self, value: str) -> str:
        """The seen-set key this receiver uses for the dedup key ``value`` (its scope + it)."""
        return self._scope_prefix + value

    # ------------------------------------------------------------ handler decisions

    async def complete_message(self, message: Any) -> None:
        """Decide that ``message`` (the one the handler was given) is processed.

        The default when the handler returns without a decision. Only recorded here;
        applied when the handler returns (seen-set first, then the broker).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._decisions.decide(message, COMPLETE)

    async def abandon_message(self, message: Any) -> None:
        """Decide that ``message`` is not processed: redelivered, as if the handler raised.

        Counts as a failed attempt (``max_attempts``).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._decisions.decide(message, ABANDON)

    async def defer_message(self, message: Any) -> None:
        """Decide to defer ``message``; its twin in the other region is deferred too.

        The copy stays in its entity, retrievable by sequence number with the SDK's
        ``receive_deferred_messages`` (georep does not fetch deferred messages).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._decisions.decide(message, Decision(Settle.DEFER))

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        """Decide to dead-letter ``message``; its twin is dead-lettered too, never processed.

        Args:
            message: The message the handler was given.
            reason: The DeadLetterReason (the seen-set keeps its first 256 characters, and
                the twin's reason is ``georep:twin:`` followed by it).
            error_description: The DeadLetterErrorDescription (this copy only; keep
                secrets out of it, as with the SDK).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._decisions.decide(message, dead_letter_decision(reason, error_description))

    # ------------------------------------------------------------------- the loop

    async def _region_loop(self, region: RegionReceiver) -> None:
        parked: list[Copy] = []
        backoff = _Backoff(self._clock)
        while True:
            if self._stopping.is_set():
                await self._abandon_all(region, parked)
                return
            room = self.concurrency - len(parked)
            fresh: list[Copy] = []
            if room > 0:
                try:
                    messages = await self._receive(region, room)
                except RegionError as exc:
                    _log.warning("receive from %s failed: %s", region.region, exc)
                    await backoff.wait(self._stopping)
                    continue
                backoff.reset()
                source, name = self.dedup_key.source, self.dedup_key.name
                now = self._clock.time()
                fresh = [Copy(m, region.delivery(m, source, name), now) for m in messages]
                received = self.stats.received
                received[region.region] = received.get(region.region, 0) + len(fresh)
                fresh = await self._settlements.complete_pings(region, fresh)
            if not fresh and not parked:
                continue
            try:
                parked = await self._turn(region, parked + fresh)
            except _Stopping:
                await self._abandon_all(region, parked + fresh)
                return
            self._parked[region.region] = len(parked)
            self.stats.parked = sum(self._parked.values())

    async def _turn(self, region: RegionReceiver, copies: list[Copy]) -> list[Copy]:
        """Claim, process, commit and settle one turn's copies; return those still parked."""
        checked: list[Copy] = []
        repeats: list[Copy] = []
        unchecked = [c for c in copies if c.delivery.key is None]
        seen_keys: set[str] = set()
        for copy in copies:
            key = copy.delivery.key
            if key is None:
                continue
            # Two copies of one message in one turn (a redelivery, a replayed batch): our
            # claim is re-entrant for our own owner, so only the first is claimed; the
            # others wait a turn and then find it done (or released, after a failure).
            (repeats if key in seen_keys else checked).append(copy)
            seen_keys.add(key)
        states = await self._claim(region, checked, copies)
        if states is None:  # store unreachable and policy "process"
            unchecked, checked, states, repeats = copies, [], [], []
        to_process = [c for c, s in zip(checked, states, strict=True) if s is ClaimState.CLAIMED]
        parked = [c for c, s in zip(checked, states, strict=True) if s is ClaimState.IN_FLIGHT]
        parked += repeats
        self.stats.unchecked += len(unchecked)

        reasons = states.reasons if isinstance(states, Claims) else {}
        for index, (copy, state) in enumerate(zip(checked, states, strict=True)):
            if state in FINAL_STATES:
                await self._settlements.settle_twin(region, copy, state, reasons.get(index))
        await self._process(region, to_process, unchecked, held=copies)
        for copy in parked:
            copy.parked_turns += 1
        if parked and len(parked) == len(copies):
            # Nothing else to do this turn: give the other holder a moment before the
            # next claim instead of spinning on the store (receive() waits when idle, but
            # not while copies are parked and the entity is busy).
            await self._clock.sleep(min(0.05 * 2 ** min(parked[0].parked_turns, 5), 1.0))
        await self._renew_parked(region, parked)
        return parked

    async def _claim(
        self, region: RegionReceiver, checked: list[Copy], held: list[Copy]
    ) -> list[ClaimState] | None:
        if not checked:
            return []
        started = self._clock.monotonic()
        keys = self._keys(checked)
        backoff = _Backoff(self._clock)
        while True:
            try:
                states = await self.seen.claim(
                    keys, owner=self._owners[region.region], lease=self.lease
                )
                self._metrics.claim_latency(self._clock.monotonic() - started)
                return states
            except StoreUnavailableError as exc:
                self.stats.store_errors += 1
                self._metrics.store_error()
                if self.on_store_unavailable == "process":
                    _log.error("seen-set unreachable (%s): processing WITHOUT dedup", exc)
                    return None
                if self._stopping.is_set():
                    # Closing: nothing was processed yet, so hand every copy back.
                    raise _Stopping from exc
                _log.error("seen-set unreachable (%s): holding %d copies, retrying", exc, len(held))
                await backoff.wait(None)
                await self._renew_locks(region, held)

    async def _store_call(
        self, region: RegionReceiver, held: list[Copy], call: Callable[[], Awaitable[object]]
    ) -> bool:
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
                self.stats.store_errors += 1
                self._metrics.store_error()
                if self.on_store_unavailable == "process":
                    return True
                if self._stopping.is_set():
                    _log.error("closing with the seen-set unreachable (%s): abandoning", exc)
                    return False
                _log.error("seen-set unreachable (%s): settlement waits for it", exc)
                await backoff.wait(None)
                await self._renew_locks(region, held)

    async def _process(
        self,
        region: RegionReceiver,
        claimed: list[Copy],
        unchecked: list[Copy],
        *,
        held: list[Copy],
    ) -> None:
        """Run the handler on every copy; record and settle each as soon as it finishes.

        A slow handler must not hold back its turn-mates: they are recorded and settled
        while it runs (batched with whatever else finished meanwhile), so a crash loses
        at most the work still running.
        """
        copies = claimed + unchecked
        if not copies:
            return
        checked = {id(c) for c in claimed}
        finished: list[tuple[Copy, Decision]] = []
        wake = asyncio.Event()
        self.stats.in_flight += len(copies)

        async def one(copy: Copy) -> None:
            try:
                finished.append((copy, await self._handle(region, copy)))
            finally:
                wake.set()

        async def settle_as_they_finish() -> None:
            remaining = len(copies)
            while remaining:
                await wake.wait()
                wake.clear()
                batch = finished[:]
                del finished[:]
                remaining -= len(batch)
                await self._finish(region, batch, checked, held)

        done = asyncio.Event()
        renewer = asyncio.ensure_future(self._keep_alive(region, held, claimed, done))
        try:
            if len(copies) == 1:  # no tasks to spread over: the common case when idle-ish
                await one(copies[0])
                await settle_as_they_finish()
            else:
                await asyncio.gather(settle_as_they_finish(), *(one(copy) for copy in copies))
        finally:
            # Told as well as cancelled: an SDK call can swallow a cancellation (Python
            # 3.11's asyncio.wait_for returns a result that raced it, cpython gh-86296),
            # and the renewer would then renew for ever while this region's loop waits.
            done.set()
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _handle(self, region: RegionReceiver, copy: Copy) -> Decision:
        """Run the handler on one copy; what it decided (or the default for how it ended).

        No decision: complete if it returned, abandon if it raised. An abandon on the
        copy's ``max_attempts``-th delivery becomes a dead-letter.
        """
        assert self._handler is not None
        span = self._settlements.start_span("process", region, copy)
        message = copy.message
        error: Exception | None = None
        self._decisions.begin(message)
        try:
            await self._handler(message)
        except Exception as exc:
            error = exc
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            _log.warning(
                "handler failed for %s from %s (delivery %d): %r",
                copy.delivery.key,
                region.region,
                copy.delivery.delivery_count,
                exc,
            )
        finally:
            decided = self._decisions.end(message)
            span.end()
            self.stats.in_flight -= 1
        decision = decided or (COMPLETE if error is None else ABANDON)
        if decision.settle is Settle.ABANDON:
            self.stats.failed += 1
            self._metrics.failed(region.region)
            if copy.delivery.delivery_count >= self.max_attempts:
                decision = max_attempts_decision(
                    copy.delivery.delivery_count, self.max_attempts, error
                )
        self._settlements.count(region, decision)
        return decision

    async def _finish(
        self,
        region: RegionReceiver,
        batch: list[tuple[Copy, Decision]],
        checked: set[int],
        held: list[Copy],
    ) -> None:
        """Record the batch's outcomes in the seen-set (one call per outcome), then settle.

        A copy whose outcome could not be recorded (closing with the store unreachable) is
        abandoned instead: settling it for good would hide it from its twin.
        """
        owner = self._owners[region.region]
        groups: dict[ClaimState | None, list[tuple[Copy, Decision]]] = {}
        for copy, decision in batch:
            if id(copy) in checked:
                groups.setdefault(decision.state, []).append((copy, decision))
        recorded: dict[ClaimState | None, bool] = {}
        for state, members in groups.items():
            keys = self._keys([copy for copy, _ in members])
            call: Callable[[], Awaitable[object]]
            if state is None:
                call = partial(self.seen.release, keys, owner=owner)
            else:
                reasons = (
                    [d.reason for _, d in members] if state is ClaimState.DEAD_LETTERED else None
                )
                call = partial(self.seen.commit, keys, owner=owner, outcome=state, reasons=reasons)
            recorded[state] = await self._store_call(region, held, call)
        for copy, decision in batch:
            kept = id(copy) not in checked or recorded[decision.state]
            settled = await self._settlements.settle(region, copy, decision if kept else ABANDON)
            # A handler that succeeded counts as processed even if its commit could not be
            # made and the copy was abandoned: its effects happened.
            self._settlements.record(region, copy, LEDGER_OUTCOMES[decision.settle], settled)

    async def _keep_alive(
        self,
        region: RegionReceiver,
        held: list[Copy],
        processing: list[Copy],
        done: asyncio.Event,
    ) -> None:
        """Until ``done``: renew every held copy's lock and our claims' leases.

        Wakes at a third of the lease, or at half the time left on the soonest lock,
        whichever comes first (a queue's lock duration can be far shorter than the lease).
        """
        owner = self._owners[region.region]
        while not done.is_set():
            now = self._clock.time()
            lock_left = [
                c.delivery.locked_until - now
                for c in held
                if not c.settled and c.delivery.locked_until is not None
            ]
            interval = min([self.lease / 3, 10.0, *(left / 2 for left in lock_left)])
            await self._clock.sleep(max(interval, 0.05))
            await self._renew_locks(region, held, margin=2 * max(interval, 0.05))
            running = [c for c in processing if not c.settled]
            keys = self._keys(running)
            if not keys:
                continue
            try:
                kept = await self.seen.extend(keys, owner=owner, lease=self.lease)
            except StoreUnavailableError:
                continue
            for key, ok in zip(keys, kept, strict=True):
                if not ok:
                    _log.warning(
                        "lost the claim on %s in %s while its handler ran: another consumer "
                        "may process it too (raise lease= above the handler's run time)",
                        key,
                        region.region,
                    )

    async def _renew_locks(
        self, region: RegionReceiver, copies: Sequence[Copy], margin: float | None = None
    ) -> None:
        """Renew the locks that expire within ``margin`` seconds (default: half a lease)."""
        margin = self.lease / 2 if margin is None else margin
        now = self._clock.time()
        for copy in copies:
            if copy.settled:
                continue
            locked_until = copy.delivery.locked_until
            if locked_until is not None and locked_until - now > margin:
                continue
            try:
                async with self._settlements.lock(region):
                    new_expiry = await region.renew_lock(copy.message)
            except RegionError as exc:
                _log.warning("could not renew a lock in %s: %s", region.region, exc)
                continue
            copy.delivery = dataclasses.replace(copy.delivery, locked_until=new_expiry)

    async def _renew_parked(self, region: RegionReceiver, parked: list[Copy]) -> None:
        if parked:
            await self._renew_locks(region, parked)

    def _keys(self, copies: Sequence[Copy]) -> list[str]:
        """The seen-set keys of ``copies`` (those with a dedup key), in this scope."""
        prefix = self._scope_prefix
        return [prefix + c.delivery.key for c in copies if c.delivery.key is not None]

    async def _close_owned(self) -> None:
        """Close the regions' clients this receiver created, concurrently, within
        ``close_timeout`` (each SDK close waits for its links to detach)."""
        if not self._owned:
            return

        async def close(region: Any) -> None:
            try:
                await region.close()
            except Exception as exc:
                _log.warning("closing the %s receiver failed: %r", region.region, exc)

        tasks = [asyncio.ensure_future(close(region)) for region in self._owned]
        try:
            with self._clock.deadline(self.close_timeout):
                await asyncio.gather(*tasks)
        except TimeoutError:
            # The deadline cancelled the closes still running (gather cancels its children).
            _log.warning(
                "%d region receiver(s) did not close within %g s; gave up on them",
                sum(1 for task in tasks if task.cancelled()),
                self.close_timeout,
            )
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _abandon_all(self, region: RegionReceiver, copies: list[Copy]) -> None:
        for copy in copies:
            with contextlib.suppress(RegionError):
                await region.abandon(copy.message)


class _Stopping(Exception):
    """Closing while the seen-set is unreachable: the turn's copies are handed back."""


def _dedup_scope(regions: Sequence[RegionReceiver], override: str | None) -> str:
    """The seen-set scope: ``override``, or the entity path both regions read (lower case).

    Raises:
        ConfigurationError: ``override`` is empty, or the regions read different entities.
    """
    if override is not None:
        if not isinstance(override, str) or not override.strip():
            raise ConfigurationError(
                f"dedup_scope must be a non-empty string, not {override!r} (leave it out to "
                "scope by the entity path)"
            )
        return override.strip().lower()
    paths = {region.region: region.entity.strip("/").lower() for region in regions}
    if len(set(paths.values())) > 1:
        described = ", ".join(f"{label} reads {path!r}" for label, path in paths.items())
        raise ConfigurationError(
            f"the regions' receivers read different entities ({described}): dedup needs "
            "one scope for both copies of a message. If they are the same entity under two "
            "names, pass dedup_scope='<one name>' (the same on every GeoReceiver of it); "
            "otherwise give the receivers of one entity"
        )
    return next(iter(paths.values()))


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


class ReceiverHandler:
    """What ``@georep.receiver(...)`` returns: the handler, still callable, plus ``run()``.

    Attributes:
        stats: Live counters (:class:`ReceiverStats`), once running.
    """

    def __init__(self, function: Handler, factory: Callable[[], GeoReceiver]) -> None:
        self._function = function
        self._factory = factory
        self._receiver: GeoReceiver | None = None
        self.__name__ = getattr(function, "__name__", "handler")
        self.__doc__ = getattr(function, "__doc__", None)

    def __call__(self, message: Any) -> Awaitable[object]:
        return self._function(message)

    @property
    def stats(self) -> ReceiverStats:
        return self._receiver.stats if self._receiver is not None else ReceiverStats()

    def _running_receiver(self, method: str) -> GeoReceiver:
        if self._receiver is None:
            raise SettlementError(
                f"{method}: this handler is not running; call it on the message the "
                "handler was given while run() is receiving"
            )
        return self._receiver

    async def complete_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.complete_message` (the default when the handler returns)."""
        await self._running_receiver("complete_message").complete_message(message)

    async def abandon_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.abandon_message`: redelivered, counts as a failed attempt."""
        await self._running_receiver("abandon_message").abandon_message(message)

    async def defer_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.defer_message`: deferred here, and its twin too."""
        await self._running_receiver("defer_message").defer_message(message)

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        """As :meth:`GeoReceiver.dead_letter_message`: dead-lettered here, and its twin too."""
        await self._running_receiver("dead_letter_message").dead_letter_message(
            message, reason=reason, error_description=error_description
        )

    async def run(self) -> None:
        """Receive and process until :meth:`aclose` or cancellation."""
        if self._receiver is None:
            self._receiver = self._factory()
        await self._receiver.run(self._function)

    async def aclose(self) -> None:
        """Stop gracefully: finish in-flight handlers, settle, close owned clients."""
        if self._receiver is not None:
            await self._receiver.aclose()


def receiver(
    *,
    primary: Any,
    secondary: Any,
    seen: SeenStore,
    queue_name: str | None = None,
    topic_name: str | None = None,
    subscription_name: str | None = None,
    **options: Any,
) -> Callable[[Handler], ReceiverHandler]:
    """Decorate ``async def handle(message)`` to receive each logical message once.

    ``primary``/``secondary`` are SDK receivers (or RegionReceivers), or connection strings
    together with ``queue_name`` (or ``topic_name`` and ``subscription_name``). Other
    options go to :class:`GeoReceiver` (``ledger=`` among them: ``aclose()`` flushes it).
    The decorated function stays callable; the returned object also has ``run()``,
    ``aclose()`` and ``stats``::

        @georep.receiver(primary=conn_a, secondary=conn_b, queue_name="orders", seen=seen)
        async def handle(message): ...

        await handle.run()
    """

    def factory() -> GeoReceiver:
        if isinstance(primary, str) and isinstance(secondary, str):
            return GeoReceiver.from_connection_strings(
                primary,
                secondary,
                queue_name=queue_name,
                topic_name=topic_name,
                subscription_name=subscription_name,
                seen=seen,
                **options,
            )
        return GeoReceiver(primary, secondary, seen=seen, **options)

    def decorate(function: Handler) -> ReceiverHandler:
        return ReceiverHandler(function, factory)

    return decorate
