"""The outbox drainer's failure paths: poison entries, refusals, TTL, errors, leases, close.

In-memory regions and outbox, FakeClock: no network, no real sleeps.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from _metrics import metric_sums
from _senders import down, geo, queueing, regions, up
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from georep import (
    DrainPolicy,
    ErrorKind,
    FailoverPolicy,
    GeoSender,
    MessageTooLargeError,
    OutboxUnavailableError,
)
from georep.exceptions import AuthenticationError, OutboxFullError, RegionError
from georep.outbox.drainer import DrainTelemetry, OutboxDrainer
from georep.testing import (
    FakeClock,
    FakeCodec,
    FakeMessage,
    InMemoryLedger,
    InMemoryOutbox,
    InMemoryRegionSender,
    settle,
)

POISON = b"poison"


class PickyRegion(InMemoryRegionSender):
    """A region that refuses the poison message (too large, or ``poison_kind``), when up."""

    poison_kind = ErrorKind.MESSAGE_TOO_LARGE

    async def send(self, messages: Any, *, timeout: float) -> None:
        await self._check()
        if any(m.body == POISON for m in self.codec.split(messages)):
            kind = self.poison_kind
            error = MessageTooLargeError if kind is ErrorKind.MESSAGE_TOO_LARGE else RegionError
            raise error(f"{self.region}: refused", region=self.region, kind=kind)
        self.payloads.append(messages)
        self.accepted.extend(self.codec.split(messages))


class SlowClosingRegion(InMemoryRegionSender):
    """A region whose close takes ``close_seconds`` of (fake) time, or never ends."""

    close_seconds: float | None = 1.0

    async def close(self) -> None:
        assert self._clock is not None
        if self.close_seconds is None:
            await asyncio.Event().wait()
        await self._clock.sleep(self.close_seconds)
        self.closed = True


async def queue_while_both_down(sender: GeoSender, primary: Any, secondary: Any, *bodies: bytes):
    down(primary, secondary)
    results = [await sender.send_messages(FakeMessage(body)) for body in bodies]
    assert all(r.queued for r in results)
    return results


async def poison_queued(
    clock: FakeClock, *bodies: bytes
) -> tuple[GeoSender, InMemoryOutbox, Any, Any]:
    """A sender over two PickyRegions whose outbox holds POISON then ``bodies`` (both down)."""
    primary, secondary = regions(cls=PickyRegion)
    outbox = InMemoryOutbox()
    sender = geo(primary, secondary, outbox=outbox, clock=clock)
    await queue_while_both_down(sender, primary, secondary, POISON, *bodies)
    return sender, outbox, primary, secondary


# -------------------------------------------------------------- refused for good


async def test_a_poison_entry_is_dead_lettered_and_the_messages_behind_it_drain() -> None:
    # Primary stays down; the backup is back but refuses the poison message for what it is.
    # Before: the refusal came back as AllRegionsUnavailableError, backed off "any region",
    # and the poison (always oldest) held the 3 healthy messages back forever.
    clock = FakeClock()
    sender, outbox, _, secondary = await poison_queued(clock, b"a", b"b", b"c")
    secondary.restore()

    for _ in range(20):
        await sender.drain_outbox()
        await clock.advance(10)

    assert [m.body for m in secondary.accepted] == [b"a", b"b", b"c"]
    assert await outbox.depth() == 0
    [dead] = await outbox.records(dead=True)
    assert dead.reason == "MessageTooLargeError (message-too-large)"
    assert dead.attempts >= 1 and dead.dead_at is not None
    assert sender.stats.dead_lettered == 1
    await sender.aclose()


async def test_a_dead_lettered_entry_can_be_replayed_or_purged(clock: FakeClock) -> None:
    sender, outbox, primary, secondary = await poison_queued(clock, b"ok")
    up(primary, secondary)
    await sender.drain_outbox()
    [dead] = await outbox.records(dead=True)

    assert await outbox.replay([dead.entry_id], now=clock.time()) == 1
    assert await outbox.depth() == 1 and await outbox.dead_depth() == 0
    await sender.drain_outbox()  # refused again: back to the dead-letter table
    assert await outbox.dead_depth() == 1
    assert await outbox.purge() == 1
    assert await outbox.dead_depth() == 0 and await outbox.depth() == 0
    await sender.aclose()


async def test_a_message_specific_refusal_never_backs_the_region_off() -> None:
    # Both regions back; poison refused by the primary (no failover). The healthy ones in
    # the same round go to the same region right after it.
    clock = FakeClock()
    sender, outbox, primary, secondary = await poison_queued(clock, b"a", b"b")
    up(primary, secondary)

    assert await sender.drain_outbox() == 2
    assert [m.body for m in primary.accepted] == [b"a", b"b"]
    assert await outbox.depth() == 0 and await outbox.dead_depth() == 1
    await sender.aclose()


async def test_an_unavailable_region_keeps_its_entries_until_it_answers_again(
    clock: FakeClock,
) -> None:
    sender, outbox, primary, secondary = queueing(clock=clock)
    await queue_while_both_down(sender, primary, secondary, b"a", b"b")

    assert await sender.drain_outbox() == 0
    assert await outbox.depth() == 2 and await outbox.dead_depth() == 0
    up(primary, secondary)
    await clock.advance(60)  # past the drainer's back-off: its next round sends them
    await sender.drain_outbox()
    assert sorted(m.body for m in primary.accepted + secondary.accepted) == [b"a", b"b"]
    assert await outbox.depth() == 0 and await outbox.dead_depth() == 0
    await sender.aclose()


# ----------------------------------------------- refused for what it is: never queued


@pytest.mark.parametrize("mode", ["passive", "active"])
async def test_a_message_the_backup_refuses_is_raised_and_never_queued(mode: str) -> None:
    primary, secondary = regions(cls=PickyRegion)
    outbox = InMemoryOutbox()
    sender = geo(primary, secondary, outbox=outbox, clock=FakeClock(), mode=mode)
    primary.fail_with(ErrorKind.CONNECTION)

    with pytest.raises(MessageTooLargeError) as raised:
        await sender.send_messages(FakeMessage(POISON))

    assert raised.value.region == "secondary"
    assert await outbox.depth() == 0 and sender.stats.queued == 0
    await sender.aclose()


async def test_refused_credentials_on_the_backup_are_raised_not_queued() -> None:
    sender, outbox, primary, secondary = queueing(clock=FakeClock())
    primary.fail_with(ErrorKind.TIMEOUT)
    secondary.fail_with(ErrorKind.AUTHENTICATION)

    with pytest.raises(AuthenticationError):
        await sender.send_messages(FakeMessage(b"x"))
    assert await outbox.depth() == 0
    await sender.aclose()


# ------------------------------------------------------------------------------- TTL


async def test_the_wait_in_the_outbox_is_taken_off_the_time_to_live(clock: FakeClock) -> None:
    sender, _, primary, secondary = queueing(clock=clock, drain=DrainPolicy(max_backoff=1))
    down(primary, secondary)
    await sender.send_messages(FakeMessage(b"t", time_to_live=10.0))
    await sender.send_messages(FakeMessage(b"none"))

    await clock.advance(4)
    up(primary, secondary)
    await clock.advance(1)  # the background drainer retries within max_backoff

    ttl, no_ttl = primary.accepted
    assert ttl.time_to_live is not None and 5.0 <= ttl.time_to_live <= 6.0
    assert no_ttl.time_to_live is None
    await sender.aclose()


async def test_a_message_whose_ttl_ran_out_in_the_outbox_is_dropped_counted_and_ledgered(
    clock: FakeClock,
) -> None:
    ledger = InMemoryLedger()
    reader = InMemoryMetricReader()
    drain = DrainPolicy(max_backoff=1)
    sender, outbox, primary, secondary = queueing(
        clock=clock, ledger=ledger, drain=drain, reader=reader
    )
    down(primary, secondary)
    expiring = await sender.send_messages(FakeMessage(b"short", time_to_live=3.0))
    await sender.send_messages(FakeMessage(b"long", time_to_live=60.0))

    await clock.advance(5)
    up(primary, secondary)
    await clock.advance(1)

    assert [m.body for m in primary.accepted] == [b"long"]
    assert await outbox.depth() == 0 and await outbox.dead_depth() == 0
    assert sender.stats.expired == 1
    [expired_row] = [r for r in ledger.sends if r.outcome == "expired"]
    assert list(expired_row.message_ids) == list(expiring.message_ids)
    assert _counter(reader, "georep.outbox.expired") == 1
    await sender.aclose()


def _counter(reader: InMemoryMetricReader, name: str) -> float:
    return metric_sums(reader, [name]).get(name, 0)


# ------------------------------------------------------------ the drainer never dies


class FlakyOutbox(InMemoryOutbox):
    """An outbox whose ``depth`` fails ``failures`` times (a file briefly unopenable)."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        super().__init__()
        self.failures = failures
        self.error = error or OutboxUnavailableError("outbox could not be used (injected)")

    async def depth(self, channel: str | None = None) -> int:
        if self.failures:
            self.failures -= 1
            raise self.error
        return await super().depth(channel)


@pytest.mark.parametrize(
    "error",
    [
        OutboxUnavailableError("outbox could not be used just now (injected)"),
        OutboxFullError("outbox x: the disk is full (injected)"),
    ],
    ids=["unavailable", "disk-full"],
)
async def test_the_drainer_survives_a_transient_outbox_error_and_drains(
    clock: FakeClock, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = regions()
    outbox = FlakyOutbox(failures=0, error=error)
    drain = DrainPolicy(initial_backoff=1, max_backoff=2)
    sender = geo(primary, secondary, outbox=outbox, clock=clock, drain=drain)
    down(primary, secondary)
    for n in range(5):
        await sender.send_messages(FakeMessage(b"%d" % n))
    await sender.aclose()
    up(primary, secondary)

    outbox.failures = 3  # the next sender's first depth() calls fail
    reader = InMemoryMetricReader()
    async with geo(
        primary, secondary, outbox=outbox, clock=clock, drain=drain, reader=reader
    ) as second:
        for _ in range(10):
            await clock.advance(2)
        assert await outbox.depth() == 0
        assert len(primary.accepted) == 5
        assert second._drainer is not None and second._drainer.errors == 3
    assert _counter(reader, "georep.outbox.drainer_errors") == 3
    # The store's own words, once per failure, without a traceback: they are expected.
    said = [r for r in caplog.records if "outbox drainer" in r.getMessage()]
    assert len(said) == 3
    assert all(r.levelname == "WARNING" and r.exc_info is None for r in said)
    assert all(str(error) in r.getMessage() for r in said)


async def test_aclose_closes_everything_even_when_the_drainer_failed(clock: FakeClock) -> None:
    primary, secondary = regions()
    ledger = InMemoryLedger()
    outbox = FlakyOutbox(failures=10**6)  # every depth() fails
    sender = geo(primary, secondary, outbox=outbox, clock=clock, ledger=ledger)
    sender._owned.extend([primary, secondary])
    async with sender:
        await clock.advance(3)
    assert primary.closed and secondary.closed
    assert ledger.flushes == 1


async def test_aclose_closes_owned_regions_concurrently_within_a_deadline(clock: FakeClock) -> None:
    primary, secondary = regions(cls=SlowClosingRegion, clock=clock)
    sender = geo(primary, secondary, clock=clock, policy=FailoverPolicy(attempt_timeout=5))
    sender._owned.extend([primary, secondary])
    closing = asyncio.ensure_future(sender.aclose())
    await clock.advance(1.0)
    assert closing.done(), "two 1 s closes take 1 s together, not 2 s"
    assert primary.closed and secondary.closed

    primary, secondary = regions(cls=SlowClosingRegion, clock=clock)
    primary.close_seconds = None  # never closes
    ledger = InMemoryLedger()
    sender = geo(
        primary, secondary, clock=clock, ledger=ledger, policy=FailoverPolicy(attempt_timeout=5)
    )
    sender._owned.extend([primary, secondary])
    closing = asyncio.ensure_future(sender.aclose())
    await clock.advance(5.0)
    assert closing.done(), "a close that hangs is bounded by the attempt deadline"
    assert secondary.closed and ledger.flushes == 1


# ------------------------------------------------------------- leases and duplicates


def slow_pair(clock: FakeClock, latency: float) -> tuple[Any, Any]:
    primary, secondary = regions(clock=clock)
    primary.latency = secondary.latency = latency
    return primary, secondary


async def test_two_drainers_with_slow_sends_never_send_an_entry_twice() -> None:
    # Before: the first drainer leased 100 entries for `lease` seconds and never renewed
    # them; with sends slower than lease/100 the second one re-sent its tail.
    clock = FakeClock()
    primary, secondary = slow_pair(clock, latency=1.0)
    outbox = InMemoryOutbox()
    drain = DrainPolicy(lease=2.0)
    policy = FailoverPolicy(attempt_timeout=2.0)
    first = geo(primary, secondary, outbox=outbox, clock=clock, drain=drain, policy=policy)
    second = geo(primary, secondary, outbox=outbox, clock=clock, drain=drain, policy=policy)
    codec = primary.codec
    await outbox.put(
        first.channel,
        [(None, codec.encode(FakeMessage(b"%d" % n, message_id=f"m{n}"))) for n in range(20)],
        now=clock.time(),
    )

    rounds = [asyncio.ensure_future(first.drain_outbox())]
    await clock.advance(2.5)  # the first drainer's original lease has run out
    rounds.append(asyncio.ensure_future(second.drain_outbox()))
    for _ in range(40):
        await clock.advance(1.0)
    delivered = await asyncio.gather(*rounds)

    ids = Counter(m.message_id for m in primary.accepted)
    assert sum(delivered) == 20 and len(ids) == 20
    assert max(ids.values()) == 1, f"duplicates: {[i for i, n in ids.items() if n > 1]}"
    assert await outbox.depth() == 0


async def test_each_entry_is_deleted_as_soon_as_it_is_accepted(clock: FakeClock) -> None:
    primary, secondary = slow_pair(clock, latency=1.0)
    outbox = InMemoryOutbox()
    sender = geo(primary, secondary, outbox=outbox, clock=clock)
    codec = primary.codec
    await outbox.put(
        sender.channel, [(None, codec.encode(FakeMessage(b"%d" % n))) for n in range(10)], now=0
    )
    draining = asyncio.ensure_future(sender.drain_outbox())
    await clock.advance(3.5)
    assert len(primary.accepted) == 3
    assert await outbox.depth() == 7, "accepted entries must not wait for the end of the round"
    await clock.advance(10)
    assert await draining == 10


async def test_aclose_mid_drain_hands_back_what_it_sent_and_releases_the_rest(
    clock: FakeClock,
) -> None:
    primary, secondary = regions(clock=clock)
    outbox = InMemoryOutbox()
    sender = geo(primary, secondary, outbox=outbox, clock=clock)
    codec = primary.codec
    await outbox.put(
        sender.channel,
        [(None, codec.encode(FakeMessage(b"%d" % n, message_id=f"m{n}"))) for n in range(10)],
        now=clock.time(),
    )
    await sender.__aenter__()  # starts the drainer
    primary.latency = 1.0
    await clock.advance(3.5)  # three accepted, the fourth in flight
    closing = asyncio.ensure_future(sender.aclose())
    await clock.advance(1.0)
    await closing
    sent_before_close = len(primary.accepted)
    assert sent_before_close == 4, "the send in flight finishes"
    assert await outbox.depth() == 10 - sent_before_close
    # Released, not leased: a new drainer takes the rest at once, and sends nothing twice.
    primary.latency = 0.0
    async with geo(primary, secondary, outbox=outbox, clock=clock):
        await clock.advance(1.0)
    ids = Counter(m.message_id for m in primary.accepted)
    assert len(ids) == 10 and max(ids.values()) == 1
    await settle()


@pytest.mark.parametrize(
    "kind", [ErrorKind.SERVER_BUSY, ErrorKind.QUOTA_EXCEEDED, ErrorKind.SERVICE_ERROR]
)
async def test_transient_refusals_are_retried_never_dead_lettered(
    kind: ErrorKind, clock: FakeClock
) -> None:
    sender, outbox, primary, _ = queueing(clock=clock)
    encoded = primary.codec.encode(FakeMessage(b"x"))
    await outbox.put(sender.channel, [(primary.namespace, encoded)], now=clock.time())
    primary.fail_with(kind)

    assert await sender.drain_outbox() == 0
    assert await outbox.depth() == 1 and await outbox.dead_depth() == 0
    primary.restore()
    await clock.advance(60)  # past the drainer's back-off: its next round retries it
    await sender.drain_outbox()
    assert [m.body for m in primary.accepted] == [b"x"], "the same entry, retried"
    assert await outbox.depth() == 0 and await outbox.dead_depth() == 0
    await sender.aclose()


class DeleteFailsOnce(InMemoryOutbox):
    def __init__(self) -> None:
        super().__init__()
        self.delete_failures = 1

    async def delete(self, entry_ids: Any) -> None:
        if self.delete_failures:
            self.delete_failures -= 1
            raise OutboxUnavailableError("outbox could not be used just now (injected)")
        await super().delete(entry_ids)


async def test_a_failed_delete_after_acceptance_is_retried_so_nothing_is_sent_twice(
    clock: FakeClock,
) -> None:
    sender, outbox, primary, _ = queueing(DeleteFailsOnce(), clock=clock)
    encoded = primary.codec.encode(FakeMessage(b"x", message_id="once"))
    await outbox.put(sender.channel, [(None, encoded)], now=clock.time())

    draining = asyncio.ensure_future(sender.drain_outbox())
    await clock.advance(1)
    assert await draining == 1
    await sender.drain_outbox()
    assert [m.message_id for m in primary.accepted] == ["once"]
    assert await outbox.depth() == 0
    await sender.aclose()


async def test_a_transient_refusal_of_one_entry_never_holds_up_the_others() -> None:
    # Quota exceeded is not an outage (no failover) but may pass later: retried on its own.
    clock = FakeClock()
    sender, outbox, primary, secondary = await poison_queued(clock, b"a", b"b")
    primary.poison_kind = secondary.poison_kind = ErrorKind.QUOTA_EXCEEDED
    up(primary, secondary)
    await clock.advance(10)

    assert [m.body for m in primary.accepted] == [b"a", b"b"]
    assert await outbox.depth() == 1 and await outbox.dead_depth() == 0
    await sender.aclose()


# ------------------------------------------------------ the drainer task and its stop


def bare_drainer(
    outbox: InMemoryOutbox, clock: FakeClock, deliver: Any
) -> tuple[OutboxDrainer, FakeCodec]:
    codec = FakeCodec()
    drainer = OutboxDrainer(
        outbox=outbox,
        channel="orders",
        codec=codec,
        policy=DrainPolicy(),
        clock=clock,
        deliver=deliver,
        unavailable_kinds={ErrorKind.CONNECTION},
        send_budget=1.0,
        telemetry=DrainTelemetry(entity="orders", meter_provider=None),
        stats=SimpleNamespace(drained=0, dead_lettered=0, expired=0, outbox_depth=None),
    )
    return drainer, codec


async def test_a_crashed_drainer_is_logged_when_it_crashes(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: the drainer's task died silently, and stop() suppressed its error."""
    primary, secondary = regions()
    outbox = FlakyOutbox(failures=1)
    sender = geo(primary, secondary, outbox=outbox, clock=clock)
    assert sender._drainer is not None

    def broken_meter() -> None:
        raise RuntimeError("a broken meter provider")

    sender._drainer._telemetry.error = broken_meter  # type: ignore[method-assign]
    async with sender:
        await clock.advance(1)
        assert not sender._drainer.running
        assert "background task georep-outbox-drainer ended with RuntimeError" in caplog.text


async def test_stopping_the_drainer_never_swallows_the_callers_cancellation(
    clock: FakeClock,
) -> None:
    """The forced stop was ``task.cancel(); with suppress(CancelledError): await task``: a
    caller cancelled while the drainer handed its entries back carried on as if not."""
    handing_back = asyncio.Event()

    class SlowRelease(InMemoryOutbox):
        async def release(self, entry_ids: Any, *, owner: str) -> int:
            await handing_back.wait()
            return await super().release(entry_ids, owner=owner)

    async def deliver(region: str | None, message: Any) -> None:
        await asyncio.Event().wait()  # a send that does not answer

    outbox = SlowRelease()
    drainer, codec = bare_drainer(outbox, clock, deliver)
    await outbox.put("orders", [(None, codec.encode(FakeMessage(b"a")))] * 2, now=clock.time())
    drainer.start()
    await settle()
    stopping = asyncio.create_task(drainer.stop(timeout=1))
    await clock.advance(1)  # the round did not finish: the drainer is cancelled
    assert not stopping.done()
    stopping.cancel()  # the caller itself is cancelled while the entries are handed back
    await settle()
    assert stopping.cancelled()
    handing_back.set()
    await settle()
    assert not drainer.running and await outbox.depth() == 2


class GatedOutbox(InMemoryOutbox):
    """An outbox whose next ``depth()`` (a drain round's last call) waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.at_gate = asyncio.Event()

    async def depth(self, channel: str | None = None) -> int:
        gate, self.gate = self.gate, None
        if gate is not None:
            self.at_gate.set()
            await gate.wait()
        return await super().depth(channel)


async def test_an_entry_queued_while_the_drainer_drains_is_drained_next_not_after_idling(
    clock: FakeClock,
) -> None:
    """The drainer cleared its wake-up after a round, dropping the wake() of an entry queued
    at the round's end: that entry waited the idle interval (1 s) for the next round."""
    primary, secondary = slow_pair(clock, latency=0.1)
    outbox = GatedOutbox()
    sender = geo(primary, secondary, outbox=outbox, clock=clock)
    codec = primary.codec
    drainer = sender._drainer
    assert drainer is not None
    await outbox.put(sender.channel, [(None, codec.encode(FakeMessage(b"first")))], now=0)
    outbox.gate = gate = asyncio.Event()
    drainer.start()
    for _ in range(10):  # the first round sends "first", then ends at the gate
        if outbox.at_gate.is_set():
            break
        await clock.advance(0.1)
    assert outbox.at_gate.is_set() and [m.body for m in primary.accepted] == [b"first"]
    await outbox.put(sender.channel, [(None, codec.encode(FakeMessage(b"second")))], now=1)
    drainer.wake()  # as queueing does
    gate.set()
    for _ in range(5):  # half the idle interval
        await clock.advance(0.1)
    assert [m.body for m in primary.accepted] == [b"first", b"second"]
    await sender.aclose()


async def test_an_accepted_entry_whose_delete_keeps_failing_is_never_sent_again(
    clock: FakeClock,
) -> None:
    # The disk stays full past the drainer's retries of the delete: the drain pauses with
    # the store's error. Before, the entry went back to the queue and, once the disk had
    # room again, was sent a second time (test_outbox_chaos's full-disk test, once).
    sender, outbox, primary, _ = queueing(DeleteFailsOnce(), clock=clock)
    outbox.delete_failures = 5  # the drainer's four tries, then the next drain's first
    for body in (b"a", b"b"):
        encoded = primary.codec.encode(FakeMessage(body, message_id=body.decode()))
        await outbox.put(sender.channel, [(None, encoded)], now=clock.time())

    for _ in range(2):
        draining = asyncio.ensure_future(sender.drain_outbox())
        await clock.advance(5)
        with pytest.raises(OutboxUnavailableError):
            await draining
    assert outbox.delete_failures == 0
    assert [m.message_id for m in primary.accepted] == ["a"], "nothing sent while paused"
    # The store answers again: the accepted entry is deleted first, never re-sent.
    draining = asyncio.ensure_future(sender.drain_outbox())
    await clock.advance(5)
    await draining
    assert [m.message_id for m in primary.accepted] == ["a", "b"]
    assert await outbox.depth() == 0
    assert sender.stats.drained == 2
    await sender.aclose()
