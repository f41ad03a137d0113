"""GeoReceiver: dedup scope, the handler's decisions, max_attempts, pings, closing.

In-memory regions, seen-set and ledger on a FakeClock (no real waiting).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from _metrics import metric_sums
from _receivers import ReceiverWorld
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from georep import ConfigurationError, GeoReceiver, SettlementError, receiver
from georep.ports import ClaimState
from georep.receive.outcomes import (
    PING_CONTENT_TYPE,
    TWIN_DESCRIPTION,
    Settle,
    dead_letter_decision,
    twin_reason,
)
from georep.testing import (
    FakeClock,
    FakeMessage,
    InMemoryLedger,
    InMemoryRegionReceiver,
)

Handler = Callable[[Any], Awaitable[object]]


class Pair:
    """One entity's two regions."""

    def __init__(self, clock: FakeClock, entity: str = "orders", secondary: str | None = None):
        self.primary = InMemoryRegionReceiver("primary", "east", entity, clock=clock)
        self.secondary = InMemoryRegionReceiver(
            "secondary", "west", secondary or entity, clock=clock
        )

    def both(self, *ids: str) -> None:
        for message_id in ids:
            self.primary.put(FakeMessage(b"x", message_id))
            self.secondary.put(FakeMessage(b"x", message_id))


class World(ReceiverWorld):
    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def receiver(self, pair: Pair, **options: Any) -> GeoReceiver:
        return self.geo(pair.primary, pair.secondary, **options)

    def receiver_of(self, message_id: str | None, **options: Any) -> tuple[Pair, GeoReceiver]:
        """A new pair whose primary holds one message (``message_id``, body ``x``), and a
        receiver on it."""
        pair = Pair(self.clock)
        pair.primary.put(FakeMessage(b"x", message_id))
        return pair, self.receiver(pair, **options)

    async def count(self, message: Any) -> None:
        self.calls[message.message_id] += 1

    def counted(self, handler: Handler) -> Handler:
        """``handler``, each message it is given counted in ``calls`` before it runs."""

        async def counting(message: Any) -> object:
            await self.count(message)
            return await handler(message)

        return counting

    async def run(self, receivers: list[tuple[GeoReceiver, Handler]], seconds: float) -> None:
        tasks = [asyncio.create_task(geo.run(handler)) for geo, handler in receivers]
        await self.clock.advance(seconds)
        closing = [asyncio.create_task(geo.aclose()) for geo, _ in receivers]
        await self.clock.advance(5)
        await asyncio.wait_for(asyncio.gather(*closing, *tasks), 1)


@pytest.fixture
def world() -> World:
    return World()


# --------------------------------------------------------------------------- dedup scope


async def test_subscriptions_of_one_topic_each_process_every_message(world: World) -> None:
    billing = Pair(world.clock, "invoices/Subscriptions/billing")
    shipping = Pair(world.clock, "invoices/Subscriptions/shipping")
    ids = [f"m{i}" for i in range(40)]
    billing.both(*ids)
    shipping.both(*ids)
    billed: Counter[str] = Counter()
    shipped: Counter[str] = Counter()

    async def bill(message: Any) -> None:
        billed[message.message_id] += 1

    async def ship(message: Any) -> None:
        shipped[message.message_id] += 1

    await world.run([(world.receiver(billing), bill), (world.receiver(shipping), ship)], 10)

    assert billed == shipped == Counter(dict.fromkeys(ids, 1))
    for pair in (billing, shipping):
        assert pair.primary.pending == pair.secondary.pending == 0


async def test_two_receivers_of_one_subscription_still_dedup(world: World) -> None:
    one = Pair(world.clock, "invoices/Subscriptions/billing")
    # The same subscription seen through another receiver, its name in another case: Service
    # Bus names are case-insensitive, so it is the same scope.
    other = Pair(world.clock, "Invoices/subscriptions/BILLING")
    one.both("a", "b")
    other.both("a", "b")

    await world.run([(world.receiver(one), world.count), (world.receiver(other), world.count)], 10)

    assert world.calls == Counter({"a": 1, "b": 1})


async def test_regions_reading_different_entities_need_an_explicit_scope(world: World) -> None:
    pair = Pair(world.clock, "orders-east", secondary="orders-west")
    with pytest.raises(ConfigurationError, match="dedup_scope") as raised:
        world.receiver(pair)
    assert "orders-east" in str(raised.value) and "orders-west" in str(raised.value)

    geo = world.receiver(pair, dedup_scope="orders")
    pair.both("a")
    await world.run([(geo, world.count)], 5)
    assert world.calls == Counter({"a": 1}), "one scope for both regions: the twin is suppressed"
    assert geo.dedup_scope == "orders"


@pytest.mark.parametrize("scope", ["", "   "])
def test_an_empty_dedup_scope_is_refused(world: World, scope: str) -> None:
    with pytest.raises(ConfigurationError, match="dedup_scope"):
        world.receiver(Pair(world.clock), dedup_scope=scope)


def test_the_default_scope_is_the_lower_cased_entity_path(world: World) -> None:
    geo = world.receiver(Pair(world.clock, "Shop/Subscriptions/Billing"))
    assert geo.dedup_scope == "shop/subscriptions/billing"
    assert geo.seen_key("id-1") == "shop/subscriptions/billing\nid-1"


# ------------------------------------------------------------------ handler decisions


def test_a_twin_is_dead_lettered_with_the_originals_reason_and_description() -> None:
    """What the seen-set keeps of a dead-letter decision gives the twin both the reason
    (marked as a twin's) and the description; one without a description gets georep's."""
    for description, expected in (("no customer", "no customer"), (None, TWIN_DESCRIPTION)):
        original = dead_letter_decision("invalid-order", description)
        twin = twin_reason(ClaimState.DEAD_LETTERED, original.recorded_reason)
        assert (twin.settle, twin.reason) == (Settle.DEAD_LETTER, "georep:twin:invalid-order")
        assert twin.description.startswith(expected)
    long = dead_letter_decision("r" * 5000, "d" * 5000)
    assert (long.reason, long.description) == ("r" * 5000, "d" * 5000), "the copy's own: whole"
    twin = twin_reason(ClaimState.DEAD_LETTERED, long.recorded_reason)
    assert twin.description == "d" * 4096, "the kept description is bounded"
    assert twin.reason == "georep:twin:" + "r" * 4096, "the kept reason is bounded"


def test_a_dead_letter_without_a_reason_gives_none_as_the_sdk_sends_none() -> None:
    """``dead_letter_message(msg)`` with no reason nor description: the copy gets neither
    (not empty strings), and its twin's reason is the twin prefix alone."""
    original = dead_letter_decision(None, None)
    assert (original.reason, original.description) == (None, None)
    twin = twin_reason(ClaimState.DEAD_LETTERED, original.recorded_reason)
    assert twin.reason == "georep:twin:"
    assert twin.description is not None and twin.description.startswith(TWIN_DESCRIPTION)
    assert twin_reason(ClaimState.DEAD_LETTERED, None).reason == "georep:twin:"


async def test_a_dead_lettered_message_is_dead_lettered_in_the_other_region_too(
    world: World,
) -> None:
    pair = Pair(world.clock)
    pair.both("poison", "fine")
    ledger = InMemoryLedger()
    geo = world.receiver(pair, ledger=ledger)

    @world.counted
    async def handle(message: Any) -> None:
        if message.message_id == "poison":
            await geo.dead_letter_message(
                message, reason="invalid-order", error_description="no customer"
            )

    await world.run([(geo, handle)], 5)

    assert world.calls == Counter({"poison": 1, "fine": 1}), "the twin was never handled"
    dead = [m for r in (pair.primary, pair.secondary) for m in r.dead_lettered]
    assert sorted(m.dead_letter_reason or "" for m in dead) == [
        "georep:twin:invalid-order",
        "invalid-order",
    ]
    [twin] = [m for m in dead if m.dead_letter_reason == "georep:twin:invalid-order"]
    # The twin carries the original's description: whichever copy a dead-letter reader
    # gets, it says why (the reason's prefix marks the twin).
    assert twin.dead_letter_error_description == "no customer"
    [original] = [m for m in dead if m.dead_letter_reason == "invalid-order"]
    assert original.dead_letter_error_description == "no customer"
    assert pair.primary.pending == pair.secondary.pending == 0
    assert geo.stats.dead_lettered == 2 and geo.stats.processed == 1
    outcomes = Counter((r.message_id, r.outcome) for r in ledger.receives)
    assert outcomes[("poison", "dead_lettered")] == 2


async def test_the_twin_of_a_message_dead_lettered_earlier_is_dead_lettered(world: World) -> None:
    # The twin arrives long after (the other region was down): the seen-set remembers.
    pair, geo = world.receiver_of("poison")

    @world.counted
    async def handle(message: Any) -> None:
        await geo.dead_letter_message(message, reason="bad")

    await world.run([(geo, handle)], 5)
    pair.secondary.put(FakeMessage(b"x", "poison"))
    later = world.receiver(pair)
    await world.run([(later, handle)], 5)

    assert world.calls == Counter({"poison": 1})
    [twin] = pair.secondary.dead_lettered
    assert twin.dead_letter_reason == "georep:twin:bad"


async def test_a_deferred_message_is_deferred_in_the_other_region_too(world: World) -> None:
    pair = Pair(world.clock)
    pair.both("later")
    ledger = InMemoryLedger()
    geo = world.receiver(pair, ledger=ledger)

    @world.counted
    async def handle(message: Any) -> None:
        await geo.defer_message(message)

    await world.run([(geo, handle)], 5)

    assert world.calls == Counter({"later": 1})
    assert len(pair.primary.deferred) == len(pair.secondary.deferred) == 1
    assert pair.primary.completed == pair.secondary.completed == []
    assert geo.stats.deferred == 2
    assert [r.outcome for r in ledger.receives] == ["deferred", "deferred"]


async def test_an_explicit_abandon_redelivers_and_a_later_attempt_processes(world: World) -> None:
    pair, geo = world.receiver_of("retry")

    @world.counted
    async def handle(message: Any) -> None:
        if world.calls[message.message_id] == 1:
            await geo.abandon_message(message)

    await world.run([(geo, handle)], 5)
    assert world.calls["retry"] == 2
    assert len(pair.primary.abandoned) == 1 and len(pair.primary.completed) == 1
    assert geo.stats.failed == 1 and geo.stats.processed == 1


async def test_complete_message_is_the_default_and_may_be_explicit(world: World) -> None:
    pair = Pair(world.clock)
    pair.both("a")
    geo = world.receiver(pair)

    async def handle(message: Any) -> None:
        await geo.complete_message(message)

    await world.run([(geo, handle)], 5)
    assert len(pair.primary.completed) == len(pair.secondary.completed) == 1
    assert geo.stats.processed == 1


async def test_deciding_twice_or_on_a_message_not_given_is_an_error(world: World) -> None:
    pair, geo = world.receiver_of("a")
    errors: list[str] = []

    async def handle(message: Any) -> None:
        await geo.defer_message(message)
        try:
            await geo.complete_message(message)
        except SettlementError as exc:
            errors.append(str(exc))
        try:
            await geo.dead_letter_message(FakeMessage(b"x", "stranger"), reason="x")
        except SettlementError as exc:
            errors.append(str(exc))

    await world.run([(geo, handle)], 5)
    assert len(errors) == 2
    assert "already called defer_message" in errors[0]
    assert "not one a handler of this GeoReceiver is processing" in errors[1]
    assert len(pair.primary.deferred) == 1, "the first decision stands"

    with pytest.raises(SettlementError, match="not one a handler"):
        await geo.complete_message(pair.primary.deferred[0])


async def test_a_decision_after_the_handler_returned_is_an_error(world: World) -> None:
    pair, geo = world.receiver_of("a")
    given: list[Any] = []

    async def handle(message: Any) -> None:
        given.append(message)

    await world.run([(geo, handle)], 5)
    with pytest.raises(SettlementError):
        await geo.dead_letter_message(given[0])
    assert len(pair.primary.completed) == 1 and pair.primary.dead_lettered == []


async def test_the_decorated_handler_decides_through_itself(world: World) -> None:
    pair = Pair(world.clock)
    pair.both("p")

    @receiver(primary=pair.primary, secondary=pair.secondary, seen=world.seen, clock=world.clock)
    async def handle(message: Any) -> None:
        world.calls[message.message_id] += 1
        await handle.dead_letter_message(message, reason="nope")

    with pytest.raises(SettlementError, match="not running"):
        await handle.defer_message(FakeMessage(b"x", "p"))
    task = asyncio.create_task(handle.run())
    await world.clock.advance(5)
    closing = asyncio.create_task(handle.aclose())
    await world.clock.advance(5)
    await asyncio.wait_for(asyncio.gather(closing, task), 1)

    assert world.calls == Counter({"p": 1})
    assert len(pair.primary.dead_lettered) == len(pair.secondary.dead_lettered) == 1
    assert handle.stats.dead_lettered == 2


async def test_a_message_without_a_dedup_key_is_settled_as_decided(world: World) -> None:
    pair, geo = world.receiver_of(None)

    async def handle(message: Any) -> None:
        await geo.dead_letter_message(message, reason="no id")

    await world.run([(geo, handle)], 5)
    [dead] = pair.primary.dead_lettered
    assert dead.dead_letter_reason == "no id"


# -------------------------------------------------------------------------- max_attempts


async def test_a_copy_failing_max_attempts_times_is_dead_lettered_and_its_twin_too(
    world: World,
) -> None:
    pair, geo = world.receiver_of("poison", max_attempts=3)

    @world.counted
    async def fails(message: Any) -> None:
        raise ValueError("password=hunter2 is wrong")

    await world.run([(geo, fails)], 10)

    assert world.calls["poison"] == 3
    assert len(pair.primary.abandoned) == 2
    [dead] = pair.primary.dead_lettered
    assert dead.dead_letter_reason == "georep:max-attempts"
    description = dead.dead_letter_error_description or ""
    assert "ValueError" in description and "max_attempts=3" in description
    assert "hunter2" not in description, "an error's text may carry secrets"
    assert geo.stats.failed == 3 and geo.stats.dead_lettered == 1

    pair.secondary.put(FakeMessage(b"x", "poison"))
    await world.run([(world.receiver(pair, max_attempts=3), fails)], 5)
    assert world.calls["poison"] == 3, "the twin was not handled again"
    [twin] = pair.secondary.dead_lettered
    assert twin.dead_letter_reason == "georep:twin:georep:max-attempts"


async def test_abandoning_counts_toward_max_attempts(world: World) -> None:
    pair, geo = world.receiver_of("a", max_attempts=2)

    async def handle(message: Any) -> None:
        await geo.abandon_message(message)

    await world.run([(geo, handle)], 5)
    [dead] = pair.primary.dead_lettered
    assert dead.dead_letter_reason == "georep:max-attempts"
    assert "abandoned" in (dead.dead_letter_error_description or "")


async def test_max_attempts_defaults_to_service_bus_max_delivery_count(world: World) -> None:
    assert world.receiver(Pair(world.clock)).max_attempts == 10


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3"])
def test_a_useless_max_attempts_is_refused(world: World, value: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        world.receiver(Pair(world.clock), max_attempts=value)


# -------------------------------------------------------------------------------- pings


async def test_pings_are_completed_without_the_handler_and_counted(world: World) -> None:
    pair = Pair(world.clock)
    pair.primary.put(FakeMessage(b"", "ping-1"), content_type=PING_CONTENT_TYPE)
    pair.secondary.put(FakeMessage(b"", None), content_type=PING_CONTENT_TYPE)
    pair.both("real")
    ledger = InMemoryLedger()
    geo = world.receiver(pair, ledger=ledger)

    await world.run([(geo, world.count)], 5)

    assert world.calls == Counter({"real": 1})
    assert geo.stats.pings == 2
    assert len(pair.primary.completed) == len(pair.secondary.completed) == 2
    assert {r.message_id for r in ledger.receives} == {"real"}


def test_the_ping_content_type_is_the_paired_senders() -> None:
    from georep.adapters.servicebus._backlog import PING_CONTENT_TYPE as SENT

    assert PING_CONTENT_TYPE == SENT


# ----------------------------------------------------------------------------- telemetry


async def test_dead_letters_and_defers_are_counted_in_metrics(world: World) -> None:
    reader = InMemoryMetricReader()
    pair = Pair(world.clock)
    pair.both("dl", "df")
    geo = world.receiver(pair, meter_provider=MeterProvider(metric_readers=[reader]))

    async def handle(message: Any) -> None:
        if message.message_id == "dl":
            await geo.dead_letter_message(message, reason="r")
        else:
            await geo.defer_message(message)

    await world.run([(geo, handle)], 5)
    sums = metric_sums(reader, {"georep.messages.dead_lettered", "georep.messages.deferred"})
    assert sums == {"georep.messages.dead_lettered": 2, "georep.messages.deferred": 2}


# -------------------------------------------------------------------------------- closing


class SlowClose:
    """An owned region whose close takes ``seconds`` on the fake clock."""

    def __init__(self, region: str, clock: FakeClock, seconds: float) -> None:
        self.region = region
        self._clock = clock
        self._seconds = seconds
        self.closed = False

    async def close(self) -> None:
        await self._clock.sleep(self._seconds)
        self.closed = True


def closing(geo: GeoReceiver, *owned: SlowClose) -> asyncio.Task[None]:
    """``geo`` owning ``owned`` (as if it had created them), being closed."""
    geo._owned.extend(owned)
    return asyncio.create_task(geo.aclose())


async def test_owned_regions_close_concurrently(world: World) -> None:
    owned = [SlowClose("primary", world.clock, 2), SlowClose("secondary", world.clock, 2)]
    task = closing(world.receiver(Pair(world.clock)), *owned)
    await world.clock.advance(2.5)
    assert task.done(), "both closes ran at once: 2 s, not 4 s"
    assert all(region.closed for region in owned)


async def test_a_hanging_close_is_bounded_by_close_timeout(world: World) -> None:
    hung = SlowClose("primary", world.clock, 1_000)
    quick = SlowClose("secondary", world.clock, 1)
    task = closing(world.receiver(Pair(world.clock), close_timeout=3), hung, quick)
    await world.clock.advance(3.5)
    assert task.done() and quick.closed and not hung.closed


async def test_a_caller_cancelled_mid_close_still_closes_the_owned_regions(world: World) -> None:
    geo = world.receiver(Pair(world.clock))
    owned = [SlowClose("primary", world.clock, 2), SlowClose("secondary", world.clock, 2)]
    task = closing(geo, *owned)
    await world.clock.advance(1)
    task.cancel()
    await world.clock.advance(2)
    assert all(region.closed for region in owned), "the close is shielded from its caller"
    again = asyncio.create_task(geo.aclose())  # idempotent: waits for the same close
    await world.clock.advance(0.1)
    assert again.done() and geo.closed


def test_a_useless_close_timeout_is_refused(world: World) -> None:
    with pytest.raises(ConfigurationError, match="close_timeout"):
        world.receiver(Pair(world.clock), close_timeout=0)


async def test_a_decision_that_cannot_be_recorded_is_not_applied(world: World) -> None:
    # Dead-lettering a copy without recording it would let its twin be processed: closing
    # while the store is unreachable hands the copy back instead.
    pair, geo = world.receiver_of("poison")

    async def handle(message: Any) -> None:
        world.seen.unavailable = True
        await geo.dead_letter_message(message, reason="bad")

    task = asyncio.create_task(geo.run(handle))
    await world.clock.advance(3)
    assert pair.primary.dead_lettered == [], "waiting for the store, not applied yet"
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(10)
    await asyncio.wait_for(asyncio.gather(closing, task), 1)
    assert pair.primary.dead_lettered == []
    assert len(pair.primary.abandoned) == 1 and pair.primary.pending == 1
