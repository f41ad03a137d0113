"""OpenTelemetry spans and metrics for senders and receivers (API only; the app picks the SDK).

Names follow the messaging semantic conventions (``messaging.system = "servicebus"``) and
keep georep's own attributes under ``georep.*``.
"""

from __future__ import annotations

__all__ = [
    "InstrumentSpec",
    "Instruments",
    "LiveGauge",
    "ReceiverMetrics",
    "SenderTelemetry",
    "TracingGate",
    "traceparent_of",
]

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Generic, NamedTuple, TypeVar

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_O = TypeVar("_O")
_K = TypeVar("_K")

_INSTRUMENTATION = "georep"
_propagator = TraceContextTextMapPropagator()
_NO_TRACING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def traceparent_of(span: Span) -> str | None:
    """The W3C ``traceparent`` of ``span``, or None when it has no valid context."""
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


class TracingGate:
    """Whether spans are worth creating: False while no tracer provider is configured.

    Re-checked at most once a second (an application may configure tracing after creating
    its senders and receivers): ``get_tracer_provider`` reads the environment, too slow to
    call on every message.
    """

    __slots__ = ("_checked_until", "_explicit", "_monotonic", "_on")

    def __init__(
        self, tracer_provider: trace.TracerProvider | None, monotonic: Callable[[], float]
    ) -> None:
        self._explicit = tracer_provider is not None
        self._monotonic = monotonic
        self._on = False
        self._checked_until = float("-inf")

    def __call__(self) -> bool:
        if self._explicit:
            return True
        now = self._monotonic()
        if now >= self._checked_until:
            self._on = not isinstance(trace.get_tracer_provider(), _NO_TRACING)
            self._checked_until = now + 1.0
        return self._on


class InstrumentSpec(NamedTuple):
    """One instrument as docs/telemetry.md lists it."""

    name: str
    unit: str
    description: str


class Instruments:
    """The instruments of one meter provider, created once per process.

    Senders and receivers come and go; their instruments must not. The API's proxy meter
    provider keeps every instrument ever created on it (and an SDK provider every gauge
    callback), so creating them per sender grew memory with every GeoSender and kept
    each one alive through its gauge callback. Synchronous instruments take their
    attributes per call, so one shared set serves every owner; gauges read a registry
    of live owners (:class:`LiveGauge`).
    """

    # An explicit provider is held weakly; None (the global provider) is process-wide.
    # Guarded by a lock: senders may be created on several event-loop threads.
    _by_provider: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()
    _global: Instruments | None = None
    _lock = threading.Lock()

    def __init__(self, meter_provider: metrics.MeterProvider | None) -> None:
        from georep import __version__

        self._meter = metrics.get_meter(_INSTRUMENTATION, __version__, meter_provider)
        self._made: dict[str, Any] = {}

    @classmethod
    def of(cls, meter_provider: metrics.MeterProvider | None) -> Instruments:
        """The shared instruments of ``meter_provider`` (None: the global one)."""
        with cls._lock:
            if meter_provider is None:
                if cls._global is None:
                    cls._global = Instruments(None)
                return cls._global
            found = cls._by_provider.get(meter_provider)
            if found is None:
                found = cls._by_provider[meter_provider] = Instruments(meter_provider)
            return found

    def counter(self, name: str, *, unit: str, description: str) -> metrics.Counter:
        """The counter ``name``, created on first use."""
        made: metrics.Counter = self._once(name, self._meter.create_counter, unit, description)
        return made

    def counters(self, specs: Mapping[_K, InstrumentSpec]) -> dict[_K, metrics.Counter]:
        """The counters of ``specs``, by the same keys (each created on first use)."""
        return {
            key: self.counter(spec.name, unit=spec.unit, description=spec.description)
            for key, spec in specs.items()
        }

    def histogram(self, name: str, *, unit: str, description: str) -> metrics.Histogram:
        """The histogram ``name``, created on first use."""
        made: metrics.Histogram = self._once(name, self._meter.create_histogram, unit, description)
        return made

    def histogram_of(self, spec: InstrumentSpec) -> metrics.Histogram:
        """The histogram ``spec`` describes, created on first use."""
        return self.histogram(spec.name, unit=spec.unit, description=spec.description)

    def gauge_of(
        self, spec: InstrumentSpec, *, combine: Callable[[list[int]], int] = sum
    ) -> LiveGauge[Any]:
        """The live-owner gauge ``spec`` describes (see :meth:`gauge`)."""
        return self.gauge(spec.name, unit=spec.unit, description=spec.description, combine=combine)

    def _once(self, name: str, create: Callable[..., Any], unit: str, description: str) -> Any:
        with self._lock:
            if name not in self._made:
                self._made[name] = create(name, unit=unit, description=description)
            return self._made[name]

    def gauge(
        self,
        name: str,
        *,
        unit: str,
        description: str,
        combine: Callable[[list[int]], int] = sum,
    ) -> LiveGauge[Any]:
        """The live-owner gauge ``name``, registered with the provider on first use.

        ``combine`` merges the values of owners with the same attributes (one point per
        attribute set reaches the exporter): ``sum`` for per-owner counts, ``max`` for a
        value the owners share (the depth of one outbox channel).
        """
        with self._lock:
            if name not in self._made:
                gauge: LiveGauge[Any] = LiveGauge(combine)
                self._meter.create_observable_gauge(
                    name, callbacks=[gauge._observe], unit=unit, description=description
                )
                self._made[name] = gauge
            found: LiveGauge[Any] = self._made[name]
            return found


class LiveGauge(Generic[_O]):
    """An observable gauge reading every live owner (see :class:`Instruments`).

    Owners (GeoSenders, GeoReceivers) are held through weak references: one that is
    collected vanishes from the reading, one whose reader returns None (closed) is
    skipped. Nothing the gauge holds keeps an owner, its SDK clients or its tasks alive.
    """

    def __init__(self, combine: Callable[[list[int]], int] = sum) -> None:
        self._combine = combine
        self._owners: dict[
            int, tuple[weakref.ref[Any], Callable[[Any], int | None], dict[str, str]]
        ] = {}
        self._next = 0
        self._owner_lock = threading.Lock()

    def add(self, owner: _O, read: Callable[[_O], int | None], attributes: dict[str, str]) -> int:
        """Observe ``read(owner)`` with ``attributes`` while ``owner`` lives.

        ``read`` must not close over ``owner`` (pass a function of it): the gauge holds the
        owner weakly and ``read`` strongly. Returns its handle.
        """
        with self._owner_lock:
            # Collected owners are swept here and when read, not from a weakref callback:
            # that would run inside the garbage collector, possibly while this thread
            # holds the lock.
            for dead in [h for h, (ref, _, _) in self._owners.items() if ref() is None]:
                del self._owners[dead]
            handle = self._next
            self._next += 1
            self._owners[handle] = (weakref.ref(owner), read, attributes)
        return handle

    def _drop(self, handle: int) -> None:
        with self._owner_lock:
            self._owners.pop(handle, None)

    def __len__(self) -> int:
        """Owners registered and not yet swept."""
        return len(self._owners)

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._owner_lock:
            owners = list(self._owners.items())
        values: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for handle, (ref, read, attributes) in owners:
            owner = ref()
            if owner is None:
                self._drop(handle)
                continue
            value = read(owner)
            if value is not None:
                values.setdefault(tuple(sorted(attributes.items())), []).append(value)
        return [Observation(self._combine(v), dict(k)) for k, v in values.items()]


SEND_DURATION: Final = InstrumentSpec(
    "georep.send.duration", "s", "Duration of send_messages calls, failover included."
)
OUTBOX_DEPTH: Final = InstrumentSpec(
    "georep.outbox.depth", "{message}", "Messages waiting in the durable outbox."
)

SENDER_COUNTERS: Final = {
    "messages": InstrumentSpec(
        "georep.messages.sent",
        "{message}",
        "Messages handed to a region, by region and outcome (accepted, failed, queued).",
    ),
    "failovers": InstrumentSpec(
        "georep.failovers",
        "{failover}",
        "Sends that went to the backup region after the active one failed.",
    ),
    "role_swaps": InstrumentSpec(
        "georep.role_swaps", "{swap}", "Times the active and backup regions swapped roles."
    ),
}
"""The sender's counters."""


class SenderTelemetry:
    """The instruments one :class:`georep.GeoSender` records into."""

    def __init__(
        self,
        *,
        entity: str,
        mode: str,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        owner: _O,
        outbox_depth: Callable[[_O], int | None],
    ) -> None:
        """Create the instruments of one sender.

        Args:
            entity: The queue or topic name (an attribute of every point).
            mode: ``"passive"`` or ``"active"``.
            tracer_provider: OpenTelemetry tracer provider (None: the global one).
            meter_provider: OpenTelemetry meter provider (None: the global one).
            owner: The sender, held weakly by the outbox-depth gauge.
            outbox_depth: Reads ``owner``'s outbox depth, None when there is none to
                report (no outbox yet, or closed); must not close over ``owner``.
        """
        from georep import __version__

        self.entity = entity
        self.mode = mode
        self.span_name = f"send {entity}"
        self.tracer = trace.get_tracer(_INSTRUMENTATION, __version__, tracer_provider)
        self.tracing = TracingGate(tracer_provider, time.monotonic)
        """True when spans are worth creating (see :class:`TracingGate`)."""
        meter = Instruments.of(meter_provider)
        self._base = {"messaging.destination.name": entity, "georep.mode": mode}
        self.span_attributes: dict[str, Any] = {
            "messaging.system": "servicebus",
            "messaging.operation.type": "send",
            **self._base,
        }
        self._counters = meter.counters(SENDER_COUNTERS)
        self._duration = meter.histogram_of(SEND_DURATION)
        # Senders of one entity and mode share an outbox channel: the same queue.
        self._depth_gauge = meter.gauge_of(OUTBOX_DEPTH, combine=max)
        self._depth_gauge.add(owner, outbox_depth, self._base)
        # Attribute dicts are built once: the send path must stay within a few microseconds.
        self._outcome_attributes: dict[tuple[str, str], dict[str, str]] = {}

    def _attributes(self, region: str, outcome: str) -> dict[str, str]:
        key = (region, outcome)
        attributes = self._outcome_attributes.get(key)
        if attributes is None:
            attributes = {**self._base, "georep.region": region, "georep.outcome": outcome}
            self._outcome_attributes[key] = attributes
        return attributes

    def messages(self, count: int, region: str, outcome: str) -> None:
        self._counters["messages"].add(count, self._attributes(region, outcome))

    def failover(self, from_region: str, to_region: str) -> None:
        self._counters["failovers"].add(
            1, {**self._base, "georep.from": from_region, "georep.to": to_region}
        )

    def role_swap(self, new_active: str) -> None:
        self._counters["role_swaps"].add(1, {**self._base, "georep.region": new_active})

    def duration(self, seconds: float, outcome: str) -> None:
        self._duration.record(seconds, self._attributes("all", outcome))


RECEIVER_COUNTERS: Final = {
    "processed": InstrumentSpec(
        "georep.messages.processed",
        "{message}",
        "Logical messages whose handler succeeded, by the region of the copy.",
    ),
    "suppressed": InstrumentSpec(
        "georep.messages.suppressed",
        "{message}",
        "Duplicate copies settled without calling the handler, by region.",
    ),
    "failed": InstrumentSpec(
        "georep.messages.failed",
        "{message}",
        "Handler failures (copy abandoned, redelivered later).",
    ),
    "dead_lettered": InstrumentSpec(
        "georep.messages.dead_lettered",
        "{message}",
        "Copies dead-lettered (by the handler, after max_attempts, or as the twin of a "
        "dead-lettered copy), by region.",
    ),
    "deferred": InstrumentSpec(
        "georep.messages.deferred",
        "{message}",
        "Copies deferred (by the handler, or as the twin of a deferred copy).",
    ),
    "store_errors": InstrumentSpec(
        "georep.seen.errors", "{error}", "Seen-set calls that failed (store unreachable)."
    ),
    "order_gaps": InstrumentSpec(
        "georep.sessions.order_gaps",
        "{message}",
        "Session messages handed on without their predecessor processed (order_wait ran out, "
        "or no region held the predecessor), by region and georep.reason.",
    ),
}
"""The receiver's counters; every key but ``store_errors`` counts copies by region."""

ORDER_WAIT: Final = InstrumentSpec(
    "georep.sessions.order_wait",
    "s",
    "Time a session message waited for its predecessor before being handled.",
)

CLAIM_DURATION: Final = InstrumentSpec(
    "georep.seen.claim.duration", "s", "Duration of one batched claim round trip to the seen-set."
)
PARKED: Final = InstrumentSpec(
    "georep.messages.parked", "{message}", "Copies waiting for another consumer's outcome."
)


class ReceiverMetrics:
    """The metrics one :class:`georep.GeoReceiver` records into."""

    def __init__(
        self,
        entity: str,
        meter_provider: metrics.MeterProvider | None,
        owner: _O,
        parked: Callable[[_O], int | None],
    ) -> None:
        """Create the instruments of one receiver.

        Args:
            entity: The queue, topic or subscription path (an attribute of every point).
            meter_provider: OpenTelemetry meter provider (None: the global one).
            owner: The receiver, held weakly by the parked-copies gauge.
            parked: Reads ``owner``'s parked count, None once closed; must not close over
                ``owner``.
        """

        meter = Instruments.of(meter_provider)
        self._base = {"messaging.destination.name": entity}
        self._by_region: dict[str, dict[str, str]] = {}
        self._counters = meter.counters(RECEIVER_COUNTERS)
        self._claim_latency = meter.histogram_of(CLAIM_DURATION)
        self._order_wait = meter.histogram_of(ORDER_WAIT)
        self._parked_gauge = meter.gauge_of(PARKED)
        self._parked_gauge.add(owner, parked, self._base)

    def _region(self, region: str) -> dict[str, str]:
        attributes = self._by_region.get(region)
        if attributes is None:
            attributes = self._by_region[region] = {**self._base, "georep.region": region}
        return attributes

    def copy(self, outcome: str, region: str) -> None:
        """Count one copy of ``region`` as ``outcome`` (a key of :data:`RECEIVER_COUNTERS`:
        processed, suppressed, failed, dead_lettered, deferred)."""
        self._counters[outcome].add(1, self._region(region))

    def store_error(self) -> None:
        self._counters["store_errors"].add(1, self._base)

    def claim_latency(self, seconds: float) -> None:
        self._claim_latency.record(seconds, self._base)

    def order_gap(self, region: str, reason: str) -> None:
        """Count one session message handed on without its predecessor (``reason``:
        ``timeout`` or ``absent``)."""
        self._counters["order_gaps"].add(1, {**self._region(region), "georep.reason": reason})

    def order_wait(self, seconds: float, region: str) -> None:
        """Record how long a session message waited for its predecessor."""
        self._order_wait.record(seconds, self._region(region))
