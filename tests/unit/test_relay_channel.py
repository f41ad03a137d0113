"""FailoverChannel on in-memory endpoints and a fake clock (no network, no real sleeps)."""

from __future__ import annotations

import asyncio
import random

import pytest
from _metrics import metric_sums
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from georep import (
    AllRegionsUnavailableError,
    ClosedError,
    ConfigurationError,
    ErrorKind,
    FailoverChannel,
    RegionError,
    RelayPolicy,
    RelayRequest,
    RelayResponse,
    RoleState,
)
from georep.testing import FakeClock, InMemoryRelayEndpoint


def make_channel(
    seed: int = 0, **kwargs: object
) -> tuple[FailoverChannel, InMemoryRelayEndpoint, InMemoryRelayEndpoint]:
    primary = InMemoryRelayEndpoint("primary")
    secondary = InMemoryRelayEndpoint("secondary")
    channel = FailoverChannel((primary, secondary), rng=random.Random(seed), **kwargs)  # type: ignore[arg-type]
    return channel, primary, secondary


def endpoints_of(
    channel: FailoverChannel, primary: InMemoryRelayEndpoint, secondary: InMemoryRelayEndpoint
) -> tuple[InMemoryRelayEndpoint, InMemoryRelayEndpoint]:
    by_name = {"primary": primary, "secondary": secondary}
    return by_name[channel.active], by_name[channel.backup]


async def test_request_goes_to_the_active_endpoint_only() -> None:
    channel, primary, secondary = make_channel()
    active, backup = endpoints_of(channel, primary, secondary)
    response = await channel.request("POST", "/orders", body=b"hello", headers={"x-id": "1"})
    assert (response.status, response.body, response.region) == (200, b"hello", active.region)
    assert active.requests == [RelayRequest("POST", "/orders", {"x-id": "1"}, b"hello")]
    assert backup.attempts == 0


async def test_initial_pick_is_random_and_covers_both_endpoints_over_seeds() -> None:
    picks = set()
    for seed in range(20):
        channel, _, _ = make_channel(seed)
        picks.add(channel.active)
    assert picks == {"primary", "secondary"}


async def test_same_seed_gives_the_same_initial_pick() -> None:
    assert make_channel(7)[0].active == make_channel(7)[0].active


@pytest.mark.parametrize(
    "kind",
    [
        ErrorKind.CONNECTION,
        ErrorKind.TIMEOUT,
        ErrorKind.SERVICE_ERROR,
        ErrorKind.AUTHENTICATION,
        ErrorKind.ENTITY_NOT_FOUND,
    ],
)
async def test_unavailable_active_fails_over_reissues_and_swaps(kind: ErrorKind) -> None:
    channel, primary, secondary = make_channel()
    active, backup = endpoints_of(channel, primary, secondary)
    active.fail_with(kind)
    response = await channel.request("GET", "/ping")
    assert response.region == backup.region
    assert [r.target for r in backup.requests] == ["/ping"]
    assert channel.active == backup.region
    assert (channel.stats.failovers, channel.stats.role_swaps) == (1, 1)
    # Next requests go straight to the new active one.
    await channel.request("GET", "/again")
    assert active.attempts == 1
    assert channel.stats.failovers == 1


async def test_application_errors_are_returned_and_never_fail_over() -> None:
    async def bad_request(request: RelayRequest) -> RelayResponse:
        return RelayResponse(400 if request.target == "/bad" else 409, {}, b"no")

    primary = InMemoryRelayEndpoint("primary", bad_request)
    secondary = InMemoryRelayEndpoint("secondary", bad_request)
    channel = FailoverChannel((primary, secondary), rng=random.Random(1))
    before = channel.active
    assert (await channel.request("POST", "/bad")).status == 400
    assert (await channel.request("POST", "/conflict")).status == 409
    assert channel.active == before
    assert channel.stats.failovers == 0
    assert primary.attempts + secondary.attempts == 2


async def test_both_down_raises_with_both_causes_and_keeps_roles() -> None:
    channel, primary, secondary = make_channel()
    before = channel.active
    primary.fail_with(ErrorKind.CONNECTION)
    secondary.fail_with(ErrorKind.SERVICE_ERROR)
    with pytest.raises(AllRegionsUnavailableError) as caught:
        await channel.request("GET", "/ping")
    causes = caught.value.causes
    assert set(causes) == {"primary", "secondary"}
    assert isinstance(causes["primary"], RegionError)
    assert causes["primary"].kind == ErrorKind.CONNECTION  # type: ignore[attr-defined]
    assert causes["secondary"].kind == ErrorKind.SERVICE_ERROR  # type: ignore[attr-defined]
    assert "primary" in str(caught.value) and "secondary" in str(caught.value)
    assert channel.active == before
    assert channel.stats.role_swaps == 0


async def test_a_kind_outside_the_policy_is_raised_without_failover() -> None:
    channel, primary, secondary = make_channel(
        policy=RelayPolicy(fail_over_on=frozenset({ErrorKind.CONNECTION}))
    )
    active, backup = endpoints_of(channel, primary, secondary)
    active.fail_with(ErrorKind.AUTHENTICATION)
    with pytest.raises(RegionError) as caught:
        await channel.request("GET", "/ping")
    assert caught.value.kind == ErrorKind.AUTHENTICATION
    assert backup.attempts == 0


async def test_concurrent_failures_swap_exactly_once() -> None:
    channel, primary, secondary = make_channel()
    active, backup = endpoints_of(channel, primary, secondary)
    active.fail_with(ErrorKind.CONNECTION)
    responses = await asyncio.gather(*(channel.request("GET", f"/{i}") for i in range(50)))
    assert {r.region for r in responses} == {backup.region}
    assert channel.stats.role_swaps == 1
    assert channel.active == backup.region
    # A later outage of the new active swaps back, once.
    active.restore()
    backup.fail_with(ErrorKind.TIMEOUT)
    await asyncio.gather(*(channel.request("GET", f"/b{i}") for i in range(20)))
    assert channel.stats.role_swaps == 2
    assert channel.active == active.region


async def test_hanging_active_times_out_on_the_attempt_deadline_then_fails_over() -> None:
    clock = FakeClock()
    channel, primary, secondary = make_channel(
        clock=clock, policy=RelayPolicy(attempt_timeout=2, request_timeout=30)
    )
    active, backup = endpoints_of(channel, primary, secondary)
    active.hang()
    task = asyncio.create_task(channel.request("GET", "/slow"))
    await clock.advance(1.9)
    assert not task.done()
    await clock.advance(0.2)
    response = await task
    assert response.region == backup.region
    assert channel.stats.role_swaps == 1


async def test_request_deadline_bounds_both_attempts() -> None:
    clock = FakeClock()
    channel, primary, secondary = make_channel(
        clock=clock, policy=RelayPolicy(attempt_timeout=10, request_timeout=60)
    )
    primary.hang()
    secondary.hang()
    task = asyncio.create_task(channel.request("GET", "/slow", timeout=3))
    await clock.advance(3.01)
    with pytest.raises(AllRegionsUnavailableError) as caught:
        await task
    assert {c.kind for c in caught.value.causes.values()} == {ErrorKind.TIMEOUT}  # type: ignore[attr-defined]


async def test_telemetry_records_spans_with_region_and_failover_metrics() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    channel, primary, secondary = make_channel(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    active, backup = endpoints_of(channel, primary, secondary)
    active.fail_with(ErrorKind.CONNECTION)
    await channel.request("PUT", "/items/1?x=2")
    (span,) = exporter.get_finished_spans()
    assert span.name == "PUT /items/1"
    assert span.attributes is not None
    assert span.attributes["georep.region"] == backup.region
    assert span.attributes["georep.failover"] is True
    (event,) = span.events
    assert event.name == "georep.failover"
    assert event.attributes == {
        "georep.from": active.region,
        "georep.to": backup.region,
        "error.type": "connection",
    }
    sums = metric_sums(reader, {"georep.relay.failovers", "georep.relay.role_swaps"})
    assert sums == {"georep.relay.failovers": 1, "georep.relay.role_swaps": 1}


async def test_bad_configuration_and_input_are_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match="exactly two"):
        FailoverChannel((InMemoryRelayEndpoint("a"),))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="region label"):
        FailoverChannel((InMemoryRelayEndpoint("a"), InMemoryRelayEndpoint("a", address="m://b")))
    with pytest.raises(ConfigurationError, match="another namespace"):
        FailoverChannel(
            (InMemoryRelayEndpoint("a", address="x"), InMemoryRelayEndpoint("b", address="x"))
        )
    with pytest.raises(ConfigurationError, match="attempt_timeout"):
        RelayPolicy(attempt_timeout=0)
    channel, _, _ = make_channel()
    with pytest.raises(ConfigurationError, match="start with '/'"):
        await channel.request("GET", "orders")
    with pytest.raises(ConfigurationError, match="unsupported method"):
        await channel.request("BREW", "/pot")


async def test_closed_channel_refuses_requests_and_closes_endpoints_once() -> None:
    channel, primary, secondary = make_channel()
    async with channel:
        await channel.request("GET", "/")
    assert primary.closed and secondary.closed
    await channel.aclose()
    with pytest.raises(ClosedError):
        await channel.request("GET", "/")


async def test_channels_sharing_a_role_state_swap_once_for_all() -> None:
    roles = RoleState("primary")
    first, p1, _ = make_channel(role_state=roles)
    second, p2, _ = make_channel(role_state=roles)
    p1.fail_with(ErrorKind.CONNECTION)
    p2.fail_with(ErrorKind.CONNECTION)
    await asyncio.gather(first.request("GET", "/a"), second.request("GET", "/b"))
    assert roles.swaps == 1
    assert first.active == second.active == "secondary"
    with pytest.raises(ConfigurationError, match="neither endpoint"):
        make_channel(role_state=RoleState("west"))
