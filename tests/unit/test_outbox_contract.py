"""The Outbox contract, run against every implementation of :class:`georep.ports.Outbox`.

Time is passed explicitly (``now=``), so leases and retry delays are tested without sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from georep.exceptions import ClosedError, ConfigurationError, OutboxFullError
from georep.outbox.sqlite import SqliteOutbox
from georep.ports import Outbox
from georep.testing._outbox import InMemoryOutbox

OutboxFactory = Callable[..., Outbox]

CHANNEL = "east+west/orders"
OTHER_CHANNEL = "east+west/invoices"
LEASE = 30.0


@pytest.fixture(params=["in-memory", "sqlite"])
async def make_outbox(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[OutboxFactory]:
    """Builds outboxes of the parametrized kind (each with its own file) and closes them."""
    created: list[Outbox] = []

    def make(**bounds: int) -> Outbox:
        outbox: Outbox
        if request.param == "sqlite":
            outbox = SqliteOutbox(tmp_path / f"outbox-{len(created)}.db", **bounds)
        else:
            outbox = InMemoryOutbox(**bounds)
        created.append(outbox)
        return outbox

    yield make
    for outbox in created:
        await outbox.aclose()


@pytest.fixture
def outbox(make_outbox: OutboxFactory) -> Outbox:
    return make_outbox()


async def test_it_satisfies_the_protocol(outbox: Outbox) -> None:
    assert isinstance(outbox, Outbox)


async def test_put_claim_delete_round_trip_keeps_order(outbox: Outbox) -> None:
    ids = await outbox.put(CHANNEL, [(None, b"first"), ("secondary", b"second")], now=100.0)
    ids += await outbox.put(CHANNEL, [("primary", b"third")], now=101.0)

    assert ids == sorted(ids)
    assert len(set(ids)) == 3
    claimed = await outbox.claim(CHANNEL, limit=10, now=200.0, lease=LEASE)
    assert [entry.entry_id for entry in claimed] == ids
    assert [entry.payload for entry in claimed] == [b"first", b"second", b"third"]
    assert [entry.enqueued_at for entry in claimed] == [100.0, 100.0, 101.0]
    assert all(entry.channel == CHANNEL and entry.attempts == 0 for entry in claimed)

    await outbox.delete(ids[:2])
    assert await outbox.depth() == 1
    await outbox.delete([ids[2], 999_999])  # an unknown id is ignored
    assert await outbox.depth() == 0
    assert await outbox.claim(CHANNEL, limit=10, now=10_000.0, lease=LEASE) == []


async def test_put_of_nothing_stores_nothing(outbox: Outbox) -> None:
    assert await outbox.put(CHANNEL, [], now=1.0) == []
    assert await outbox.depth() == 0


async def test_claim_returns_at_most_limit_oldest_first(outbox: Outbox) -> None:
    ids = await outbox.put(CHANNEL, [(None, bytes([n])) for n in range(5)], now=1.0)

    first = await outbox.claim(CHANNEL, limit=2, now=1.0, lease=LEASE)
    second = await outbox.claim(CHANNEL, limit=2, now=1.0, lease=LEASE)
    third = await outbox.claim(CHANNEL, limit=2, now=1.0, lease=LEASE)

    assert [entry.entry_id for entry in first] == ids[:2]
    assert [entry.entry_id for entry in second] == ids[2:4]
    assert [entry.entry_id for entry in third] == ids[4:]


async def test_claimed_entry_is_hidden_until_its_lease_passes(outbox: Outbox) -> None:
    [entry_id] = await outbox.put(CHANNEL, [(None, b"m")], now=0.0)

    assert [e.entry_id for e in await outbox.claim(CHANNEL, limit=5, now=10.0, lease=LEASE)] == [
        entry_id
    ]
    assert await outbox.claim(CHANNEL, limit=5, now=10.0 + LEASE - 0.001, lease=LEASE) == []
    again = await outbox.claim(CHANNEL, limit=5, now=10.0 + LEASE, lease=LEASE)

    assert [entry.entry_id for entry in again] == [entry_id]
    assert again[0].attempts == 0  # a lease that ran out is not a counted failure
    assert await outbox.depth(CHANNEL) == 1  # leased entries still count


async def test_entry_is_not_due_before_it_was_put(outbox: Outbox) -> None:
    await outbox.put(CHANNEL, [(None, b"m")], now=50.0)

    assert await outbox.claim(CHANNEL, limit=5, now=49.0, lease=LEASE) == []
    assert len(await outbox.claim(CHANNEL, limit=5, now=50.0, lease=LEASE)) == 1


async def test_retry_later_counts_the_attempt_and_delays_the_entry(outbox: Outbox) -> None:
    [entry_id] = await outbox.put(CHANNEL, [(None, b"m")], now=0.0)
    await outbox.claim(CHANNEL, limit=1, now=1.0, lease=LEASE)

    await outbox.retry_later([entry_id], not_before=100.0)
    # The lease is dropped, but the entry is not due before not_before.
    assert await outbox.claim(CHANNEL, limit=1, now=99.0, lease=LEASE) == []
    [retried] = await outbox.claim(CHANNEL, limit=1, now=100.0, lease=LEASE)
    assert (retried.entry_id, retried.attempts, retried.payload) == (entry_id, 1, b"m")

    await outbox.retry_later([entry_id, 999_999], not_before=200.0)
    [retried_twice] = await outbox.claim(CHANNEL, limit=1, now=200.0, lease=LEASE)
    assert retried_twice.attempts == 2


async def test_channels_are_isolated(outbox: Outbox) -> None:
    [order] = await outbox.put(CHANNEL, [(None, b"order")], now=0.0)
    [invoice] = await outbox.put(OTHER_CHANNEL, [(None, b"invoice")], now=0.0)

    assert [e.entry_id for e in await outbox.claim(CHANNEL, limit=10, now=1.0, lease=LEASE)] == [
        order
    ]
    other = await outbox.claim(OTHER_CHANNEL, limit=10, now=1.0, lease=LEASE)
    assert [(entry.entry_id, entry.channel) for entry in other] == [(invoice, OTHER_CHANNEL)]


async def test_region_none_and_labels_are_preserved(outbox: Outbox) -> None:
    await outbox.put(CHANNEL, [(None, b"any"), ("secondary", b"pinned")], now=0.0)

    claimed = await outbox.claim(CHANNEL, limit=10, now=0.0, lease=LEASE)

    assert [(entry.region, entry.payload) for entry in claimed] == [
        (None, b"any"),
        ("secondary", b"pinned"),
    ]


async def test_depth_counts_per_channel_and_in_total(outbox: Outbox) -> None:
    await outbox.put(CHANNEL, [(None, b"a"), (None, b"b")], now=0.0)
    await outbox.put(OTHER_CHANNEL, [(None, b"c")], now=0.0)

    assert await outbox.depth(CHANNEL) == 2
    assert await outbox.depth(OTHER_CHANNEL) == 1
    assert await outbox.depth("nobody") == 0
    assert await outbox.depth() == 3


async def test_count_bound_refuses_the_whole_put(make_outbox: OutboxFactory) -> None:
    outbox = make_outbox(max_entries=3)
    await outbox.put(CHANNEL, [(None, b"a"), (None, b"b")], now=0.0)

    with pytest.raises(OutboxFullError, match=r"max_entries=3.*restore a region") as info:
        await outbox.put(CHANNEL, [(None, b"c"), (None, b"d")], now=0.0)

    assert info.value.retryable
    assert await outbox.depth() == 2
    assert len(await outbox.put(CHANNEL, [(None, b"c")], now=0.0)) == 1  # exactly at the bound


async def test_byte_bound_refuses_the_whole_put(make_outbox: OutboxFactory) -> None:
    outbox = make_outbox(max_bytes=20)
    await outbox.put(CHANNEL, [(None, b"0123456789")], now=0.0)

    with pytest.raises(OutboxFullError, match="max_bytes=20") as info:
        await outbox.put(CHANNEL, [(None, b"SECRET"), (None, b"SECRET")], now=0.0)

    assert "SECRET" not in str(info.value)  # payloads never appear in errors
    assert await outbox.depth() == 1
    await outbox.put(CHANNEL, [(None, b"0123456789")], now=0.0)  # exactly at the bound


async def test_deleting_frees_room_under_the_bounds(make_outbox: OutboxFactory) -> None:
    outbox = make_outbox(max_entries=1, max_bytes=4)
    [entry_id] = await outbox.put(CHANNEL, [(None, b"1234")], now=0.0)
    with pytest.raises(OutboxFullError):
        await outbox.put(CHANNEL, [(None, b"x")], now=0.0)

    await outbox.delete([entry_id])

    assert len(await outbox.put(CHANNEL, [(None, b"5678")], now=0.0)) == 1


@pytest.mark.parametrize("bounds", [{"max_entries": 0}, {"max_bytes": -1}])
def test_non_positive_bounds_are_refused(
    make_outbox: OutboxFactory, bounds: dict[str, int]
) -> None:
    [name] = bounds
    with pytest.raises(ConfigurationError, match=name):
        make_outbox(**bounds)


@pytest.mark.parametrize(("limit", "lease"), [(0, LEASE), (1, 0.0)])
async def test_claim_refuses_a_useless_limit_or_lease(
    outbox: Outbox, limit: int, lease: float
) -> None:
    with pytest.raises(ConfigurationError):
        await outbox.claim(CHANNEL, limit=limit, now=0.0, lease=lease)


async def test_every_call_after_aclose_raises_closed_error(outbox: Outbox) -> None:
    [entry_id] = await outbox.put(CHANNEL, [(None, b"m")], now=0.0)
    await outbox.aclose()

    with pytest.raises(ClosedError):
        await outbox.put(CHANNEL, [(None, b"m")], now=0.0)
    with pytest.raises(ClosedError):
        await outbox.put(CHANNEL, [], now=0.0)
    with pytest.raises(ClosedError):
        await outbox.claim(CHANNEL, limit=1, now=0.0, lease=LEASE)
    with pytest.raises(ClosedError):
        await outbox.delete([entry_id])
    with pytest.raises(ClosedError):
        await outbox.retry_later([entry_id], not_before=1.0)
    with pytest.raises(ClosedError):
        await outbox.depth()


async def test_aclose_is_idempotent(outbox: Outbox) -> None:
    await outbox.depth()
    await outbox.aclose()
    await outbox.aclose()


async def test_aclose_before_first_use(outbox: Outbox) -> None:
    await outbox.aclose()

    with pytest.raises(ClosedError):
        await outbox.depth()


async def claimed_by_one(outbox: Outbox, now: float = 0.0) -> int:
    """Put one entry (``a``, at 0) and let owner ``one`` claim it at ``now``: its id."""
    [entry_id] = await outbox.put(CHANNEL, [(None, b"a")], now=0.0)
    await outbox.claim(CHANNEL, limit=1, now=now, lease=LEASE, owner="one")
    return entry_id


async def test_a_lease_renewed_by_its_owner_outlives_the_original(outbox: Outbox) -> None:
    entry_id = await claimed_by_one(outbox)

    assert await outbox.renew([entry_id], owner="one", now=LEASE - 1, lease=LEASE) == [entry_id]
    assert await outbox.claim(CHANNEL, limit=1, now=LEASE + 1, lease=LEASE, owner="two") == []


async def test_a_lease_taken_over_is_never_renewed_released_or_retried_by_the_old_owner(
    outbox: Outbox,
) -> None:
    entry_id = await claimed_by_one(outbox)
    [taken] = await outbox.claim(CHANNEL, limit=1, now=LEASE + 1, lease=LEASE, owner="two")
    assert taken.entry_id == entry_id

    assert await outbox.renew([entry_id], owner="one", now=LEASE + 2, lease=LEASE) == []
    await outbox.release([entry_id], owner="one")
    await outbox.retry_later([entry_id], not_before=0.0, owner="one")
    # Still leased to "two": nobody else can claim it.
    assert await outbox.claim(CHANNEL, limit=1, now=LEASE + 3, lease=LEASE, owner="three") == []


async def test_release_hands_an_entry_back_at_once_without_counting_an_attempt(
    outbox: Outbox,
) -> None:
    entry_id = await claimed_by_one(outbox, now=1.0)
    await outbox.release([entry_id], owner="one")

    [again] = await outbox.claim(CHANNEL, limit=1, now=1.0, lease=LEASE, owner="two")
    assert again.entry_id == entry_id and again.attempts == 0


async def test_dead_letter_moves_an_entry_aside_and_replay_brings_it_back(
    make_outbox: OutboxFactory,
) -> None:
    outbox: Any = make_outbox(max_entries=2)
    first, second = await outbox.put(CHANNEL, [(None, b"a"), ("west", b"bb")], now=5.0)
    await outbox.claim(CHANNEL, limit=2, now=6.0, lease=LEASE, owner="one")
    await outbox.dead_letter([(first, "MessageTooLargeError (message-too-large)")], now=7.0)

    assert await outbox.depth() == 1 and await outbox.dead_depth() == 1
    [dead] = await outbox.records(dead=True)
    assert (dead.entry_id, dead.state, dead.size, dead.attempts) == (first, "dead", 1, 1)
    assert (dead.reason, dead.dead_at, dead.enqueued_at) == (
        "MessageTooLargeError (message-too-large)",
        7.0,
        5.0,
    )
    [queued] = await outbox.records(dead=False)
    assert (queued.entry_id, queued.state, queued.region) == (second, "queued", "west")
    # Dead letters do not count against the bounds: the queue has room for one more.
    await outbox.put(CHANNEL, [(None, b"c")], now=8.0)
    with pytest.raises(OutboxFullError):
        await outbox.replay(now=9.0)
    assert await outbox.dead_depth() == 1, "a refused replay moves nothing"

    await outbox.delete([second])
    assert await outbox.replay([first], now=9.0) == 1
    claimed = await outbox.claim(CHANNEL, limit=5, now=9.0, lease=LEASE)
    oldest = claimed[0]
    assert (oldest.entry_id, oldest.enqueued_at, oldest.attempts) == (first, 5.0, 0)


async def test_purge_deletes_dead_letters_all_or_by_id(outbox: Any) -> None:
    ids = await outbox.put(CHANNEL, [(None, b"a"), (None, b"b"), (None, b"c")], now=0.0)
    await outbox.dead_letter([(i, "InvalidMessageError") for i in ids], now=1.0)

    assert await outbox.purge([ids[1], 999]) == 1
    assert [r.entry_id for r in await outbox.records(dead=True)] == [ids[0], ids[2]]
    assert await outbox.purge() == 2
    assert await outbox.dead_depth() == 0 and await outbox.depth() == 0


# ------------------------------------------------------------- a session's order


async def test_held_sessions_names_the_sessions_with_an_entry_queued(outbox: Outbox) -> None:
    ids = await outbox.put(
        CHANNEL, [(None, b"a"), (None, b"b"), (None, b"c")], now=0.0, sessions=["s1", None, "s2"]
    )
    await outbox.put(OTHER_CHANNEL, [(None, b"x")], now=0.0, sessions=["s3"])

    assert await outbox.held_sessions(CHANNEL) == {"s1", "s2"}
    assert await outbox.held_sessions(CHANNEL, ["s2", "s3", "s9"]) == {"s2"}
    assert await outbox.held_sessions(CHANNEL, []) == set()
    await outbox.claim(CHANNEL, limit=1, now=0.0, lease=LEASE)  # leased still counts
    await outbox.dead_letter([(ids[2], "InvalidMessageError")], now=1.0)  # dead does not
    assert await outbox.held_sessions(CHANNEL) == {"s1"}
    await outbox.delete([ids[0]])
    assert await outbox.held_sessions(CHANNEL) == set()


async def test_a_put_needs_one_session_id_per_item(outbox: Outbox) -> None:
    with pytest.raises(ConfigurationError, match="one session id"):
        await outbox.put(CHANNEL, [(None, b"a"), (None, b"b")], now=0.0, sessions=["s1"])
    assert await outbox.depth() == 0


async def test_a_session_entry_waits_while_an_earlier_one_of_its_session_is_leased(
    outbox: Outbox,
) -> None:
    first, second, other = await outbox.put(
        CHANNEL, [(None, b"s1-1"), (None, b"s1-2"), (None, b"s2-1")], now=0.0,
        sessions=["s1", "s1", "s2"],
    )  # fmt: skip
    [claimed] = await outbox.claim(CHANNEL, limit=1, now=1.0, lease=LEASE, owner="a")
    assert claimed.entry_id == first and claimed.session_id == "s1"

    # A second drainer gets the other session, never s1's next entry behind the first.
    taken = await outbox.claim(CHANNEL, limit=10, now=1.0, lease=LEASE, owner="b")
    assert [e.entry_id for e in taken] == [other]

    await outbox.delete([first])
    assert [e.entry_id for e in await outbox.claim(CHANNEL, limit=10, now=2.0, lease=LEASE)] == [
        second
    ]


async def test_a_session_entry_waits_while_an_earlier_one_is_not_due(outbox: Outbox) -> None:
    first, second, plain = await outbox.put(
        CHANNEL, [(None, b"s1-1"), (None, b"s1-2"), (None, b"none")], now=0.0,
        sessions=["s1", "s1", None],
    )  # fmt: skip
    await outbox.claim(CHANNEL, limit=1, now=0.0, lease=LEASE, owner="a")
    await outbox.retry_later([first], not_before=100.0, owner="a")

    assert [e.entry_id for e in await outbox.claim(CHANNEL, limit=10, now=50.0, lease=LEASE)] == [
        plain
    ]
    # Due again (the plain entry's lease ran out too): one claim, in order.
    due = await outbox.claim(CHANNEL, limit=10, now=100.0, lease=LEASE)
    assert [e.entry_id for e in due] == [first, second, plain]


async def test_a_session_is_ordered_per_region_and_any_region_waits_for_both(
    outbox: Outbox,
) -> None:
    # Active mode queues a copy per region: the secondary's copies of a session do not
    # wait for the primary's; an entry for any region waits for every earlier one.
    p1, s1, p2, s2, any3 = await outbox.put(
        CHANNEL,
        [("east", b"1"), ("west", b"1"), ("east", b"2"), ("west", b"2"), (None, b"3")],
        now=0.0,
        sessions=["s"] * 5,
    )
    await outbox.claim(CHANNEL, limit=1, now=0.0, lease=LEASE, owner="a")
    await outbox.retry_later([p1], not_before=100.0, owner="a")

    taken = await outbox.claim(CHANNEL, limit=10, now=1.0, lease=LEASE)
    assert [e.entry_id for e in taken] == [s1, s2]
    await outbox.delete([s1, s2])
    assert await outbox.claim(CHANNEL, limit=10, now=2.0, lease=LEASE) == []
    later = await outbox.claim(CHANNEL, limit=10, now=100.0, lease=LEASE)
    assert [e.entry_id for e in later] == [p1, p2, any3]
