"""RegionChannel and RegionDeadline, and the shielded close every sender now shares; on a
fake clock."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from georep import ErrorKind, FailoverChannel, PairedNamespaceOptions, PairedSender
from georep._channel import RegionChannel, RegionDeadline
from georep._classify import UNAVAILABLE_KINDS
from georep.exceptions import RegionError, RegionUnavailableError
from georep.testing import FakeClock, FakeMessage, InMemoryRegionSender, InMemoryRelayEndpoint


async def test_a_timeout_is_region_unavailable_naming_that_region() -> None:
    clock = FakeClock()
    sender = InMemoryRegionSender("backlog-1", "west", clock=clock)
    sender.hang()
    channel = RegionChannel(sender, clock=clock)
    call = asyncio.ensure_future(channel.call(5.0, sender.send, FakeMessage(b"x")))
    await clock.advance(5.0)
    with pytest.raises(RegionUnavailableError, match=r"^backlog-1 did not answer within 5 s$") as e:
        await call
    assert (e.value.region, e.value.kind) == ("backlog-1", ErrorKind.TIMEOUT)
    assert isinstance(e.value.__cause__, TimeoutError)


async def test_region_deadline_names_a_receive_as_the_receiver_does() -> None:
    clock = FakeClock()

    async def receive() -> None:
        with RegionDeadline(clock, 7.0, "east", name="east:", what="a receive did not return"):
            await asyncio.Event().wait()

    call = asyncio.ensure_future(receive())
    await clock.advance(7.0)
    with pytest.raises(RegionUnavailableError, match=r"^east: a receive did not return within 7 s"):
        await call


async def test_calls_queued_behind_a_failing_region_fail_together() -> None:
    clock = FakeClock()
    sender = InMemoryRegionSender("primary", "east", clock=clock)
    sender.hang()
    channel = RegionChannel(sender, clock=clock, fail_over_on=UNAVAILABLE_KINDS)
    first = asyncio.ensure_future(channel.call(5.0, sender.send, FakeMessage(b"1")))
    second = asyncio.ensure_future(channel.call(5.0, sender.send, FakeMessage(b"2")))
    await clock.advance(5.0)
    await asyncio.sleep(0)
    assert first.done() and second.done(), "the queued call does not wait a deadline of its own"
    with pytest.raises(RegionUnavailableError, match="did not answer"):
        await first
    with pytest.raises(RegionUnavailableError, match="failed while this call waited"):
        await second
    assert sender.attempts == 1 and channel.failures == 1


async def test_failures_outside_fail_over_on_are_not_counted() -> None:
    clock = FakeClock()
    sender = InMemoryRegionSender("primary", "east", clock=clock)
    sender.fail_with(ErrorKind.AUTHENTICATION)
    channel = RegionChannel(sender, clock=clock, fail_over_on=UNAVAILABLE_KINDS, cooldown=3.0)
    with pytest.raises(RegionError) as error:
        await channel.call(5.0, sender.send, FakeMessage(b"1"))
    channel.settle(error.value)
    assert channel.failures == 0 and channel.cooling(clock.monotonic()) is None


async def test_a_counted_failure_cools_the_region_down_until_a_success() -> None:
    clock = FakeClock()
    sender = InMemoryRegionSender("primary", "east", clock=clock)
    channel = RegionChannel(sender, clock=clock, fail_over_on=UNAVAILABLE_KINDS, cooldown=3.0)
    error = RegionUnavailableError("down", region="primary", kind=ErrorKind.CONNECTION)
    channel.settle(error)
    assert channel.cooling(clock.monotonic()) is error
    await clock.advance(3.0)
    assert channel.cooling(clock.monotonic()) is None
    channel.settle(error)
    channel.settle(None)
    assert channel.cooling(clock.monotonic()) is None


def paired(clock: FakeClock, primary: InMemoryRegionSender) -> PairedSender:
    backlog = [InMemoryRegionSender("backlog-0", "west", "east/x-servicebus-transfer/0")]
    return PairedSender(
        primary,
        backlog,
        rewrite=lambda message, destination, **_: message,
        make_ping=lambda: FakeMessage(b""),
        options=PairedNamespaceOptions(backlog_queue_count=1, ping_timeout=2),
        rng=random.Random(1),
        clock=clock,
    )


async def test_paired_sender_timeout_names_the_primarys_own_label() -> None:
    clock = FakeClock()
    primary = InMemoryRegionSender("east", "east-ns", clock=clock)
    primary.hang()
    sender = paired(clock, primary)
    send = asyncio.ensure_future(sender.send_messages(FakeMessage(b"1")))
    await clock.advance(2.0)
    with pytest.raises(RegionUnavailableError, match=r"^east did not answer") as error:
        await send
    assert error.value.region == "east"


class SlowClosing(InMemoryRegionSender):
    async def close(self) -> None:
        assert self._clock is not None
        await self._clock.sleep(1.0)
        self.closed = True


async def test_paired_sender_close_is_shielded_from_the_callers_cancellation() -> None:
    clock = FakeClock()
    primary = SlowClosing("primary", "east", clock=clock)
    sender = paired(clock, primary)
    sender._owned.append(primary)
    closing = asyncio.ensure_future(sender.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    await clock.advance(1.0)
    assert primary.closed, "a caller cancelled mid-close leaves nothing open"
    await sender.aclose()  # idempotent: waits for the first close, closes nothing twice


async def test_relay_channel_keeps_endpoints_open_when_asked() -> None:
    endpoints: Any = (InMemoryRelayEndpoint("primary"), InMemoryRelayEndpoint("secondary"))
    channel = FailoverChannel(endpoints)
    await channel.aclose(close_endpoints=False)
    assert channel.closed and not any(e.closed for e in endpoints)
    await channel.aclose()  # idempotent: the first call's choice stands
    assert not any(e.closed for e in endpoints)
