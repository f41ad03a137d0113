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
from opentelemetry.trace import INVALID_SPAN, Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from georep._clock import SystemClock
from georep._policy import DedupKey, Seconds, seconds
from georep._telemetry import ReceiverMetrics, TracingGate
from georep.exceptions import (
    ClosedError,
    ConfigurationError,
    RegionError,
    StoreUnavailableError,
)
from georep.ports import (
    ClaimState,
    Clock,
    Delivery,
    Ledger,
    ReceiveRecord,
    RegionReceiver,
    SeenStore,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["GeoReceiver", "ReceiverHandler", "ReceiverStats", "receiver"]

_log = logging.getLogger("georep.receiver")
_propagator = TraceContextTextMapPropagator()

Handler = Callable[[Any], Awaitable[object]]
StorePolicy = Literal["pause", "process"]


@dataclass(slots=True)
class ReceiverStats:
    """Live counters of one GeoReceiver.

    Attributes:
        processed: Copies whose handler succeeded (each is one logical message).
        suppressed: Duplicate copies settled without calling the handler, by region.
        failed: Handler failures (the copy was abandoned and will be redelivered).
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
    parked: int = 0
    in_flight: int = 0
    store_errors: int = 0
    unchecked: int = 0
    received: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Copy:
    message: Any
    delivery: Delivery
    received_at: float = 0.0
    """Wall-clock seconds when the receive call returned it (for the ledger)."""
    parked_turns: int = 0
    settled: bool = False


def _as_region_receiver(receiver: Any, region: str) -> RegionReceiver:
    if isinstance(receiver, RegionReceiver):
        return receiver
    try:
        from georep.adapters.servicebus import ServiceBusRegionReceiver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            f"{region} receiver is a {type(receiver).__name__}; wrapping an SDK receiver "
            "needs pip install 'georep[servicebus]'"
        ) from exc
    wrapped: RegionReceiver = ServiceBusRegionReceiver(receiver, region=region)
    return wrapped


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
        ledger: Record one row per copy received (e.g. :class:`georep.ParquetLedger`): which
            region, processed, suppressed or failed, and when. The caller owns it:
            :meth:`aclose` flushes it but does not close it.
        clock: Time source (tests inject :class:`georep.testing.FakeClock`).
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    Raises:
        ConfigurationError: A setting is out of range.
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
        ledger: Ledger | None = None,
        clock: Clock | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
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
        # One owner per region loop: the twin in the other region must not find "our"
        # claim and process the message a second time.
        self._owners = {r.region: f"{self.owner}/{r.region}" for r in self._regions}
        self.stats = ReceiverStats()
        self._tracer = trace.get_tracer("georep", None, tracer_provider)
        self._tracing = TracingGate(tracer_provider, self._clock.monotonic)
        self._metrics = ReceiverMetrics(self.entity, meter_provider, self.stats)
        self._owned: list[Any] = []
        self._stopping = asyncio.Event()
        self._closed = False
        self._running: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}
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
        from georep.adapters.servicebus import open_region_receiver

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
            handler: ``async def handler(message)``; raising means "not processed" (the
                copy is abandoned and redelivered). It must not settle the message.

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
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(self._stopped.wait())
        for region in self._owned:
            with contextlib.suppress(Exception):
                await region.close()
        if self.ledger is not None:
            with contextlib.suppress(Exception):
                await self.ledger.flush()

    async def peek_all(self, count: int) -> dict[str, list[Any]]:
        """Up to ``count`` messages from each region, without locking them.

        Loops past short answers (a partitioned entity answers one fragment at a time), so
        each list is ``count`` long unless the region holds fewer.

        Returns:
            The peeked messages per region label.
        """
        peeked: dict[str, list[Any]] = {}
        for region in self._regions:
            async with self._region_lock(region):
                peeked[region.region] = await region.peek(count)
        return peeked

    # ------------------------------------------------------------------- the loop

    async def _region_loop(self, region: RegionReceiver) -> None:
        parked: list[_Copy] = []
        backoff = _Backoff(self._clock)
        while True:
            if self._stopping.is_set():
                await self._abandon_all(region, parked)
                return
            room = self.concurrency - len(parked)
            fresh: list[_Copy] = []
            if room > 0:
                try:
                    async with self._region_lock(region):
                        messages = await region.receive(room, max_wait=self.max_wait)
                except RegionError as exc:
                    _log.warning("receive from %s failed: %s", region.region, exc)
                    await backoff.wait(self._stopping)
                    continue
                backoff.reset()
                source, name = self.dedup_key.source, self.dedup_key.name
                now = self._clock.time()
                fresh = [_Copy(m, region.delivery(m, source, name), now) for m in messages]
                received = self.stats.received
                received[region.region] = received.get(region.region, 0) + len(fresh)
            if not fresh and not parked:
                continue
            try:
                parked = await self._turn(region, parked + fresh)
            except _Stopping:
                await self._abandon_all(region, parked + fresh)
                return
            self._parked[region.region] = len(parked)
            self.stats.parked = sum(self._parked.values())

    async def _turn(self, region: RegionReceiver, copies: list[_Copy]) -> list[_Copy]:
        """Claim, process, commit and settle one turn's copies; return those still parked."""
        checked: list[_Copy] = []
        repeats: list[_Copy] = []
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
        done = [c for c, s in zip(checked, states, strict=True) if s is ClaimState.DONE]
        parked = [c for c, s in zip(checked, states, strict=True) if s is ClaimState.IN_FLIGHT]
        parked += repeats
        self.stats.unchecked += len(unchecked)

        for copy in done:
            suppressed = self.stats.suppressed
            suppressed[region.region] = suppressed.get(region.region, 0) + 1
            self._metrics.suppressed(region.region)
            settled = await self._settle(region, copy, complete=True, duplicate=True)
            self._record(region, copy, "suppressed", settled)
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
        self, region: RegionReceiver, checked: list[_Copy], held: list[_Copy]
    ) -> list[ClaimState] | None:
        if not checked:
            return []
        started = self._clock.monotonic()
        keys = _keys(checked)
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
        self, region: RegionReceiver, held: list[_Copy], call: Callable[[], Awaitable[object]]
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
        claimed: list[_Copy],
        unchecked: list[_Copy],
        *,
        held: list[_Copy],
    ) -> None:
        """Run the handler on every copy; commit and settle each as soon as it finishes.

        A slow handler must not hold back its turn-mates: they are committed and settled
        while it runs (batched with whatever else finished meanwhile), so a crash loses
        at most the work still running.
        """
        copies = claimed + unchecked
        if not copies:
            return
        assert self._handler is not None
        handler = self._handler
        checked = {id(c) for c in claimed}
        owner = self._owners[region.region]
        finished: list[tuple[_Copy, bool]] = []
        wake = asyncio.Event()
        self.stats.in_flight += len(copies)

        async def one(copy: _Copy) -> None:
            span = self._start_span("process", region, copy)
            ok = False
            try:
                await handler(copy.message)
                ok = True
                self.stats.processed += 1
                self._metrics.processed(region.region)
            except Exception as exc:
                self.stats.failed += 1
                self._metrics.failed(region.region)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                _log.warning(
                    "handler failed for %s from %s (delivery %d): %r",
                    copy.delivery.key,
                    region.region,
                    copy.delivery.delivery_count,
                    exc,
                )
            finally:
                span.end()
                self.stats.in_flight -= 1
                finished.append((copy, ok))
                wake.set()

        async def settle_as_they_finish() -> None:
            remaining = len(copies)
            while remaining:
                await wake.wait()
                wake.clear()
                batch = finished[:]
                del finished[:]
                remaining -= len(batch)
                succeeded = [c for c, ok in batch if ok and id(c) in checked]
                failed = [c for c, ok in batch if not ok and id(c) in checked]
                committed = True
                if succeeded:
                    committed = await self._store_call(
                        region, held, partial(self.seen.commit, _keys(succeeded), owner=owner)
                    )
                if failed:
                    await self._store_call(
                        region, held, partial(self.seen.release, _keys(failed), owner=owner)
                    )
                for copy, ok in batch:
                    complete = ok and (committed or id(copy) not in checked)
                    settled = await self._settle(region, copy, complete=complete, duplicate=False)
                    # A handler that succeeded counts as processed even if its commit could
                    # not be made and the copy was abandoned: its effects happened.
                    self._record(region, copy, "processed" if ok else "failed", settled)

        renewer = asyncio.ensure_future(self._keep_alive(region, held, claimed))
        try:
            if len(copies) == 1:  # no tasks to spread over: the common case when idle-ish
                await one(copies[0])
                await settle_as_they_finish()
            else:
                await asyncio.gather(settle_as_they_finish(), *(one(copy) for copy in copies))
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _keep_alive(
        self, region: RegionReceiver, held: list[_Copy], processing: list[_Copy]
    ) -> None:
        """While handlers run: renew every held copy's lock and our claims' leases.

        Wakes at a third of the lease, or at half the time left on the soonest lock,
        whichever comes first (a queue's lock duration can be far shorter than the lease).
        """
        owner = self._owners[region.region]
        while True:
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
            keys = _keys(running)
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
        self, region: RegionReceiver, copies: Sequence[_Copy], margin: float | None = None
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
                async with self._region_lock(region):
                    new_expiry = await region.renew_lock(copy.message)
            except RegionError as exc:
                _log.warning("could not renew a lock in %s: %s", region.region, exc)
                continue
            copy.delivery = Delivery(
                copy.delivery.key,
                copy.delivery.delivery_count,
                copy.delivery.enqueued_at,
                new_expiry,
                copy.delivery.traceparent,
            )

    async def _renew_parked(self, region: RegionReceiver, parked: list[_Copy]) -> None:
        if parked:
            await self._renew_locks(region, parked)

    async def _settle(
        self, region: RegionReceiver, copy: _Copy, *, complete: bool, duplicate: bool
    ) -> bool:
        """Complete or abandon ``copy``; False when the broker did not take the settlement."""
        span = self._start_span("settle", region, copy)
        span.set_attribute("georep.duplicate", duplicate)
        span.set_attribute("messaging.operation.name", "complete" if complete else "abandon")
        copy.settled = True
        try:
            async with self._region_lock(region):
                if complete:
                    await region.complete(copy.message)
                else:
                    await region.abandon(copy.message)
        except RegionError as exc:
            # The copy will be redelivered; if it was processed its key is done, so the
            # redelivery is suppressed.
            _log.warning("settling a copy in %s failed: %s", region.region, exc)
            return False
        finally:
            span.end()
        return True

    def _record(self, region: RegionReceiver, copy: _Copy, outcome: str, settled: bool) -> None:
        ledger = self.ledger
        if ledger is None:
            return
        delivery = copy.delivery
        ledger.record_receive(
            ReceiveRecord(
                message_id=delivery.key or "",
                entity=self.entity,
                region=region.region,
                outcome=outcome,
                delivery_count=delivery.delivery_count,
                enqueued_at=delivery.enqueued_at,
                received_at=copy.received_at,
                settled_at=self._clock.time() if settled else None,
            )
        )

    def _region_lock(self, region: RegionReceiver) -> asyncio.Lock:
        """Settlements and lock renewals may overlap within a turn; the SDK's receiver
        takes one call at a time."""
        lock = self._locks.get(region.region)
        if lock is None:
            lock = self._locks[region.region] = asyncio.Lock()
        return lock

    async def _abandon_all(self, region: RegionReceiver, copies: list[_Copy]) -> None:
        for copy in copies:
            with contextlib.suppress(RegionError):
                await region.abandon(copy.message)

    # ---------------------------------------------------------------- telemetry

    def _start_span(self, operation: str, region: RegionReceiver, copy: _Copy) -> trace.Span:
        if not self._tracing():
            return INVALID_SPAN
        links = []
        if copy.delivery.traceparent:
            context = trace.get_current_span(
                _propagator.extract({"traceparent": copy.delivery.traceparent})
            ).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        return self._tracer.start_span(
            f"{operation} {self.entity}",
            kind=SpanKind.CONSUMER if operation == "process" else SpanKind.CLIENT,
            links=links,
            attributes={
                "messaging.system": "servicebus",
                "messaging.destination.name": self.entity,
                "messaging.operation.type": operation,
                "georep.region": region.region,
                "georep.duplicate": False,
                "messaging.message.delivery_count": copy.delivery.delivery_count,
            },
        )


class _Stopping(Exception):
    """Closing while the seen-set is unreachable: the turn's copies are handed back."""


def _keys(copies: Sequence[_Copy]) -> list[str]:
    return [c.delivery.key for c in copies if c.delivery.key is not None]


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
