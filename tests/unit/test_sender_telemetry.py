"""GeoSender's spans, traceparent propagation and metrics, read through the OTel SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _metrics import metric_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from georep import ErrorKind, GeoSender, RoleState
from georep.testing import FakeClock, FakeMessage, InMemoryOutbox, InMemoryRegionSender


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


async def test_failover_is_traced_and_counted(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    tracer_provider, exporter = spans
    reader = InMemoryMetricReader()
    primary = InMemoryRegionSender("primary", "east")
    secondary = InMemoryRegionSender("secondary", "west")
    sender = GeoSender(
        primary,
        secondary,
        role_state=RoleState("east"),
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    await sender.send_messages(FakeMessage(b"a"))
    primary.fail_with(ErrorKind.CONNECTION)
    await sender.send_messages(FakeMessage(b"b"))

    first, second = exporter.get_finished_spans()
    assert first.name == second.name == "send orders"
    assert first.kind is SpanKind.PRODUCER
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["messaging.system"] == "servicebus"
    assert first.attributes["georep.mode"] == "passive"
    assert first.attributes["georep.region"] == "primary"
    assert "georep.failover" not in first.attributes
    assert second.attributes["georep.region"] == "secondary"
    assert second.attributes["georep.failover"] is True
    events = [event.name for event in second.events]
    assert events == ["georep.region_failed", "georep.role_swap"]

    # The copy in the backup carries the send span's traceparent.
    [copy] = secondary.accepted
    trace_id = format(second.context.trace_id, "032x")
    span_id = format(second.context.span_id, "016x")
    flags = format(second.context.trace_flags, "02x")
    assert copy.application_properties["traceparent"] == f"00-{trace_id}-{span_id}-{flags}"

    points = metric_points(reader)
    sent = {(a["georep.region"], a["georep.outcome"]): v for a, v in points["georep.messages.sent"]}
    assert sent == {
        ("primary", "accepted"): 1,
        ("primary", "failed"): 1,
        ("secondary", "accepted"): 1,
    }
    assert [v for _, v in points["georep.failovers"]] == [1]
    assert [v for _, v in points["georep.role_swaps"]] == [1]
    assert sum(v for _, v in points["georep.send.duration"]) == 2


async def test_an_existing_traceparent_is_never_overwritten(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    tracer_provider, _ = spans
    primary = InMemoryRegionSender("primary", "east")
    sender = GeoSender(
        primary,
        InMemoryRegionSender("secondary", "west"),
        role_state=RoleState("east"),
        tracer_provider=tracer_provider,
    )
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await sender.send_messages(FakeMessage(b"a", application_properties={"traceparent": upstream}))
    assert primary.accepted[0].application_properties["traceparent"] == upstream


async def test_outbox_depth_is_observed() -> None:
    reader = InMemoryMetricReader()
    primary = InMemoryRegionSender("primary", "east")
    secondary = InMemoryRegionSender("secondary", "west")
    primary.fail_with(ErrorKind.CONNECTION)
    secondary.fail_with(ErrorKind.CONNECTION)
    sender = GeoSender(
        primary,
        secondary,
        role_state=RoleState("east"),
        outbox=InMemoryOutbox(),
        clock=FakeClock(),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    await sender.send_messages([FakeMessage(b"a"), FakeMessage(b"b")])
    points = metric_points(reader)
    assert [v for _, v in points["georep.outbox.depth"]] == [2]
    queued = [v for a, v in points["georep.messages.sent"] if a["georep.outcome"] == "queued"]
    assert queued == [2]
    await sender.aclose()
