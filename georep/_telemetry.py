"""OpenTelemetry spans and metrics for senders and receivers (API only; the app picks the SDK).

Names follow the messaging semantic conventions (``messaging.system = "servicebus"``) and
keep georep's own attributes under ``georep.*``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["ReceiverMetrics", "SenderTelemetry", "TracingGate", "traceparent_of"]

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


class SenderTelemetry:
    """The instruments one :class:`georep.GeoSender` records into."""

    def __init__(
        self,
        *,
        entity: str,
        mode: str,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        outbox_depth: Callable[[], int | None],
    ) -> None:
        from georep import __version__

        self.entity = entity
        self.mode = mode
        self.span_name = f"send {entity}"
        self.tracer = trace.get_tracer(_INSTRUMENTATION, __version__, tracer_provider)
        self.tracing = TracingGate(tracer_provider, time.monotonic)
        """True when spans are worth creating (see :class:`TracingGate`)."""
        meter = metrics.get_meter(_INSTRUMENTATION, __version__, meter_provider)
        self._base = {"messaging.destination.name": entity, "georep.mode": mode}
        self.span_attributes: dict[str, Any] = {
            "messaging.system": "servicebus",
            "messaging.operation.type": "send",
            **self._base,
        }
        self._messages = meter.create_counter(
            "georep.messages.sent",
            unit="{message}",
            description="Messages handed to a region, by region and outcome "
            "(accepted, failed, queued).",
        )
        self._failovers = meter.create_counter(
            "georep.failovers",
            unit="{failover}",
            description="Sends that went to the backup region after the active one failed.",
        )
        self._role_swaps = meter.create_counter(
            "georep.role_swaps",
            unit="{swap}",
            description="Times the active and backup regions swapped roles.",
        )
        self._duration = meter.create_histogram(
            "georep.send.duration",
            unit="s",
            description="Duration of send_messages calls, failover included.",
        )
        self._outbox_depth = outbox_depth

        def observe_depth(_options: CallbackOptions) -> Iterable[Observation]:
            depth = self._outbox_depth()
            if depth is not None:
                yield Observation(depth, self._base)

        meter.create_observable_gauge(
            "georep.outbox.depth",
            callbacks=[observe_depth],
            unit="{message}",
            description="Messages waiting in the durable outbox.",
        )
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
        self._messages.add(count, self._attributes(region, outcome))

    def failover(self, from_region: str, to_region: str) -> None:
        self._failovers.add(1, {**self._base, "georep.from": from_region, "georep.to": to_region})

    def role_swap(self, new_active: str) -> None:
        self._role_swaps.add(1, {**self._base, "georep.region": new_active})

    def duration(self, seconds: float, outcome: str) -> None:
        self._duration.record(seconds, self._attributes("all", outcome))


class ReceiverMetrics:
    """The metrics one :class:`georep.GeoReceiver` records into."""

    def __init__(
        self, entity: str, meter_provider: metrics.MeterProvider | None, stats: Any
    ) -> None:
        from georep import __version__

        meter = metrics.get_meter(_INSTRUMENTATION, __version__, meter_provider)
        self._base = {"messaging.destination.name": entity}
        self._by_region: dict[str, dict[str, str]] = {}
        self._processed = meter.create_counter(
            "georep.messages.processed",
            unit="{message}",
            description="Logical messages whose handler succeeded, by the region of the copy.",
        )
        self._suppressed = meter.create_counter(
            "georep.messages.suppressed",
            unit="{message}",
            description="Duplicate copies settled without calling the handler, by region.",
        )
        self._failed = meter.create_counter(
            "georep.messages.failed",
            unit="{message}",
            description="Handler failures (copy abandoned, redelivered later).",
        )
        self._store_errors = meter.create_counter(
            "georep.seen.errors",
            unit="{error}",
            description="Seen-set calls that failed (store unreachable).",
        )
        self._claim_latency = meter.create_histogram(
            "georep.seen.claim.duration",
            unit="s",
            description="Duration of one batched claim round trip to the seen-set.",
        )

        def observe_parked(_options: CallbackOptions) -> Iterable[Observation]:
            yield Observation(stats.parked, self._base)

        meter.create_observable_gauge(
            "georep.messages.parked",
            callbacks=[observe_parked],
            unit="{message}",
            description="Copies waiting for another consumer's outcome.",
        )

    def _region(self, region: str) -> dict[str, str]:
        attributes = self._by_region.get(region)
        if attributes is None:
            attributes = self._by_region[region] = {**self._base, "georep.region": region}
        return attributes

    def processed(self, region: str) -> None:
        self._processed.add(1, self._region(region))

    def suppressed(self, region: str) -> None:
        self._suppressed.add(1, self._region(region))

    def failed(self, region: str) -> None:
        self._failed.add(1, self._region(region))

    def store_error(self) -> None:
        self._store_errors.add(1, self._base)

    def claim_latency(self, seconds: float) -> None:
        self._claim_latency.record(seconds, self._base)
