"""The SeenStore contract, run against every implementation of :class:`georep.ports.SeenStore`.

The ``redis`` parameter talks to a real Redis (``$REDIS_URL``, default the local one) and is
skipped, with the reason, when none answers; ``redis-cluster`` to a Redis Cluster the session
starts (3 masters, 3 replicas); select them with ``-k redis`` or leave them out with
``-k "not redis"``. Time moves through the harness's ``advance``: a FakeClock for the
in-memory store (no real waiting), ``asyncio.sleep`` past short leases for Redis.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio

from georep.adapters.redis import RedisSeenSet, embedded_redis_url, private_redis_server
from georep.exceptions import ClosedError, ConfigurationError, StoreUnavailableError
from georep.ports import Claims, ClaimState, ScheduleStore, SeenStore
from georep.testing import FakeClock
from georep.testing._seen import InMemorySeenSet

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
UNREACHABLE_URL = "redis://:s3cret@127.0.0.1:1/0"

LONG_LEASE = 30.0
"""A lease no test outlives."""
SHORT_LEASE = 0.1
"""A lease tests let run out (real seconds for Redis)."""
PAST_SHORT_LEASE = 0.2
"""Long enough after SHORT_LEASE for Redis to have expired the key, with margin."""

ALICE, BOB = "alice", "bob"

SeenSet = InMemorySeenSet | RedisSeenSet


@dataclass
class Harness:
    """One implementation under test.

    Attributes:
        make: Builds a store (keyword arguments: ``window``); closed by the fixture.
        make_unavailable: Builds a store whose every non-empty call must fail.
        advance: Lets ``seconds`` pass for the stores this harness made.
    """

    make: Callable[..., SeenSet]
    make_unavailable: Callable[[], SeenSet]
    advance: Callable[[float], Awaitable[None]]


@functools.cache
def redis_unreachable_reason() -> str | None:
    try:
        with redis.Redis.from_url(REDIS_URL, socket_timeout=1, socket_connect_timeout=1) as r:
            r.ping()
    except redis.RedisError as exc:
        return f"no Redis answers at {REDIS_URL} ({exc}); set REDIS_URL or start one"
    return None


def skip_unless_redis_answers() -> None:
    reason = redis_unreachable_reason()
    if reason is not None:
        pytest.skip(reason)


async def delete_prefix(client: redis.asyncio.Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    for start in range(0, len(keys), 1000):
        await client.delete(*keys[start : start + 1000])


@pytest.fixture
async def redis_client() -> AsyncIterator[redis.asyncio.Redis]:
    """A client of the test Redis; skips the test when none answers."""
    skip_unless_redis_answers()
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


@pytest.fixture(
    params=["in-memory", "redis", pytest.param("redis-cluster", marks=pytest.mark.redis_cluster)]
)
async def harness(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[Harness]:
    created: list[SeenSet] = []

    def keep(store: SeenSet) -> SeenSet:
        created.append(store)
        return store

    client: redis.asyncio.Redis | None = None
    if request.param == "in-memory":
        clock = FakeClock()

        def make_memory(**options: Any) -> SeenSet:
            return keep(InMemorySeenSet(clock=clock, **options))

        def make_memory_unavailable() -> SeenSet:
            store = InMemorySeenSet(clock=clock)
            store.unavailable = True
            return keep(store)

        yield Harness(make_memory, make_memory_unavailable, clock.advance)
    else:
        cluster = request.param == "redis-cluster"
        if cluster:
            url = request.getfixturevalue("redis_cluster").url
        else:
            skip_unless_redis_answers()
            url = REDIS_URL

        def make_redis(**options: Any) -> SeenSet:
            if cluster:  # its first call discovers the cluster: slow on a loaded machine
                options.setdefault("operation_timeout", 10.0)
            return keep(RedisSeenSet(url, prefix=prefix, cluster=cluster, **options))

        def make_redis_unavailable() -> SeenSet:
            return keep(
                RedisSeenSet(UNREACHABLE_URL, prefix=prefix, cluster=cluster, operation_timeout=0.2)
            )

        yield Harness(make_redis, make_redis_unavailable, asyncio.sleep)
        if not cluster:
            client = redis.asyncio.Redis.from_url(REDIS_URL)
    for store in created:
        await store.aclose()
    if client is not None:
        await delete_prefix(client, prefix)
        await client.aclose()


@pytest.fixture
def store(harness: Harness) -> SeenSet:
    return harness.make()


# ------------------------------------------------------------------------------ claims


async def test_it_satisfies_the_protocol(store: SeenSet) -> None:
    assert isinstance(store, SeenStore)


async def test_a_new_key_is_claimed(store: SeenSet) -> None:
    assert await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE) == [ClaimState.CLAIMED]


async def test_the_same_owner_claims_again(store: SeenSet) -> None:
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)

    assert await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE) == [ClaimState.CLAIMED]


async def test_another_owner_finds_it_in_flight(store: SeenSet) -> None:
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]


async def test_a_committed_key_is_done_for_everyone(store: SeenSet) -> None:
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(["m1"], owner=ALICE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.DONE]
    assert await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE) == [ClaimState.DONE]


async def test_commit_marks_done_whoever_held_the_key(store: SeenSet) -> None:
    await store.claim(["held-by-alice"], owner=ALICE, lease=LONG_LEASE)

    await store.commit(["held-by-alice", "never-claimed"], owner=BOB)

    assert await store.claim(["held-by-alice", "never-claimed"], owner=ALICE, lease=1.0) == [
        ClaimState.DONE,
        ClaimState.DONE,
    ]


async def test_batch_states_come_back_in_key_order(store: SeenSet) -> None:
    await store.claim(["bobs"], owner=BOB, lease=LONG_LEASE)
    await store.claim(["mine"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(["done"], owner=BOB)

    states = await store.claim(
        ["new", "bobs", "done", "mine", "new-too", "done"], owner=ALICE, lease=LONG_LEASE
    )

    assert states == [
        ClaimState.CLAIMED,
        ClaimState.IN_FLIGHT,
        ClaimState.DONE,
        ClaimState.CLAIMED,
        ClaimState.CLAIMED,
        ClaimState.DONE,
    ]


async def test_a_key_twice_in_one_claim_is_claimed_twice(store: SeenSet) -> None:
    assert await store.claim(["m1", "m1"], owner=ALICE, lease=LONG_LEASE) == [
        ClaimState.CLAIMED,
        ClaimState.CLAIMED,
    ]
    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]


# ------------------------------------------------------------------ recorded outcomes


async def test_a_dead_lettered_key_answers_dead_lettered_with_its_reason(store: SeenSet) -> None:
    await store.claim(["poison"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(
        ["poison", "bad-too"],
        owner=ALICE,
        outcome=ClaimState.DEAD_LETTERED,
        reasons=["invalid-order", "r\u00e9sum\u00e9 missing"],
    )

    claims = await store.claim(["new", "poison", "bad-too"], owner=BOB, lease=LONG_LEASE)

    assert claims == [ClaimState.CLAIMED, ClaimState.DEAD_LETTERED, ClaimState.DEAD_LETTERED]
    assert isinstance(claims, Claims)
    assert claims.reasons == {1: "invalid-order", 2: "r\u00e9sum\u00e9 missing"}


async def test_a_dead_lettered_key_without_reasons_has_an_empty_reason(store: SeenSet) -> None:
    await store.commit(["poison"], owner=ALICE, outcome=ClaimState.DEAD_LETTERED)

    claims = await store.claim(["poison"], owner=ALICE, lease=LONG_LEASE)

    assert claims == [ClaimState.DEAD_LETTERED]
    assert isinstance(claims, Claims) and claims.reasons == {0: ""}


async def test_a_deferred_key_answers_deferred_for_everyone(store: SeenSet) -> None:
    await store.claim(["later"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(["later"], owner=ALICE, outcome=ClaimState.DEFERRED)

    assert await store.claim(["later"], owner=BOB, lease=LONG_LEASE) == [ClaimState.DEFERRED]
    assert await store.claim(["later"], owner=ALICE, lease=LONG_LEASE) == [ClaimState.DEFERRED]


async def test_recorded_outcomes_are_final_for_release_and_extend(store: SeenSet) -> None:
    await store.claim(["dl", "df"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(["dl"], owner=ALICE, outcome=ClaimState.DEAD_LETTERED, reasons=["x"])
    await store.commit(["df"], owner=ALICE, outcome=ClaimState.DEFERRED)

    await store.release(["dl", "df"], owner=ALICE)

    assert await store.extend(["dl", "df"], owner=ALICE, lease=LONG_LEASE) == [False, False]
    assert await store.claim(["dl", "df"], owner=BOB, lease=LONG_LEASE) == [
        ClaimState.DEAD_LETTERED,
        ClaimState.DEFERRED,
    ]


async def test_peek_reads_every_state_without_claiming(store: SeenSet) -> None:
    await store.claim(["held", "done", "dl", "df"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(["done"], owner=ALICE)
    await store.commit(["dl"], owner=ALICE, outcome=ClaimState.DEAD_LETTERED, reasons=["x"])
    await store.commit(["df"], owner=ALICE, outcome=ClaimState.DEFERRED)

    assert await store.peek(["new", "held", "done", "dl", "df"]) == [
        None,
        ClaimState.IN_FLIGHT,
        ClaimState.DONE,
        ClaimState.DEAD_LETTERED,
        ClaimState.DEFERRED,
    ]
    # Peeking claimed nothing: another owner still claims the new key.
    assert await store.claim(["new"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]


async def test_session_state_is_kept_apart_from_the_keys_and_can_be_cleared(
    store: SeenSet,
) -> None:
    assert await store.get_session_state("orders\ns1") is None
    await store.set_session_state("orders\ns1", b"step 3")
    await store.claim(["orders\ns1"], owner=ALICE, lease=LONG_LEASE)  # a dedup key alike
    assert await store.get_session_state("orders\ns1") == b"step 3"
    assert await store.get_session_state("orders\ns2") is None
    await store.set_session_state("orders\ns1", None)
    assert await store.get_session_state("orders\ns1") is None


async def test_schedules_are_kept_per_scope_until_dropped_or_expired(store: SeenSet) -> None:
    assert isinstance(store, ScheduleStore)
    far = time.time() + 3600
    await store.keep_schedules("east|west|orders", {5: b'{"west": 9}', 6: b"x"}, expires_at=far)
    await store.keep_schedules("east|west|other", {5: b"other"}, expires_at=far)
    await store.keep_schedules("east|west|orders", {7: b"late"}, expires_at=1.0)  # 1970: gone
    assert await store.find_schedules("east|west|orders", [5, 6, 7, 8]) == [
        b'{"west": 9}',
        b"x",
        None,
        None,
    ]
    await store.drop_schedules("east|west|orders", [5])
    assert await store.find_schedules("east|west|orders", [5, 6]) == [None, b"x"]
    assert await store.find_schedules("east|west|other", [5]) == [b"other"]


async def test_recorded_outcomes_expire_after_the_window(harness: Harness) -> None:
    store = harness.make(window=SHORT_LEASE)
    await store.commit(["dl"], owner=ALICE, outcome=ClaimState.DEAD_LETTERED, reasons=["x"])
    await store.commit(["df"], owner=ALICE, outcome=ClaimState.DEFERRED)

    await harness.advance(PAST_SHORT_LEASE)

    assert await store.claim(["dl", "df"], owner=BOB, lease=LONG_LEASE) == [
        ClaimState.CLAIMED,
        ClaimState.CLAIMED,
    ]


async def test_a_recorded_outcome_is_one_round_trip_however_many_keys(store: SeenSet) -> None:
    keys = [f"k{i}" for i in range(200)]
    before = store.round_trips

    await store.commit(keys, owner=ALICE, outcome=ClaimState.DEAD_LETTERED, reasons=keys)
    claims = await store.claim(keys, owner=BOB, lease=LONG_LEASE)

    assert store.round_trips - before == 2
    assert isinstance(claims, Claims) and claims.reasons == dict(enumerate(keys))


@pytest.mark.parametrize("outcome", [ClaimState.CLAIMED, ClaimState.IN_FLIGHT])
async def test_commit_refuses_a_state_that_is_not_an_outcome(
    store: SeenSet, outcome: ClaimState
) -> None:
    with pytest.raises(ConfigurationError, match="final outcome"):
        await store.commit(["m1"], owner=ALICE, outcome=outcome)
    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]


async def test_commit_refuses_reasons_that_are_not_one_per_key(store: SeenSet) -> None:
    with pytest.raises(ConfigurationError, match="one per key"):
        await store.commit(
            ["a", "b"], owner=ALICE, outcome=ClaimState.DEAD_LETTERED, reasons=["only one"]
        )
    assert await store.claim(["a", "b"], owner=BOB, lease=LONG_LEASE) == [
        ClaimState.CLAIMED,
        ClaimState.CLAIMED,
    ]


# ----------------------------------------------------------------------------- release


async def test_release_drops_the_owners_claim(store: SeenSet) -> None:
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)

    await store.release(["m1"], owner=ALICE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]


async def test_release_leaves_another_owners_claim(store: SeenSet) -> None:
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)

    await store.release(["m1"], owner=BOB)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]
    assert await store.extend(["m1"], owner=ALICE, lease=LONG_LEASE) == [True]


async def test_release_leaves_done_keys_done(store: SeenSet) -> None:
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(["m1"], owner=ALICE)

    await store.release(["m1", "never-claimed"], owner=ALICE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.DONE]


# ------------------------------------------------------------------------------ extend


async def test_extend_answers_per_key_whether_the_owner_still_holds_it(store: SeenSet) -> None:
    await store.claim(["mine", "released"], owner=ALICE, lease=LONG_LEASE)
    await store.claim(["bobs"], owner=BOB, lease=LONG_LEASE)
    await store.commit(["done"], owner=ALICE)
    await store.release(["released"], owner=ALICE)

    renewed = await store.extend(
        ["mine", "bobs", "done", "released", "absent"], owner=ALICE, lease=LONG_LEASE
    )

    assert renewed == [True, False, False, False, False]
    # Extending never creates or takes over a claim.
    assert await store.claim(["absent"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]
    assert await store.claim(["done"], owner=BOB, lease=LONG_LEASE) == [ClaimState.DONE]


async def test_extend_keeps_a_claim_past_its_first_lease(harness: Harness) -> None:
    store = harness.make()
    await store.claim(["m1"], owner=ALICE, lease=SHORT_LEASE)

    assert await store.extend(["m1"], owner=ALICE, lease=LONG_LEASE) == [True]
    await harness.advance(PAST_SHORT_LEASE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]


async def test_claiming_again_renews_the_lease(harness: Harness) -> None:
    store = harness.make()
    await store.claim(["m1"], owner=ALICE, lease=SHORT_LEASE)

    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    await harness.advance(PAST_SHORT_LEASE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]


# ---------------------------------------------------------------------------- expiry


async def test_an_expired_lease_lets_another_owner_claim(harness: Harness) -> None:
    store = harness.make()
    await store.claim(["m1"], owner=ALICE, lease=SHORT_LEASE)
    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]

    await harness.advance(PAST_SHORT_LEASE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]
    # The first owner lost it: it can neither extend nor release Bob's claim.
    assert await store.extend(["m1"], owner=ALICE, lease=LONG_LEASE) == [False]
    await store.release(["m1"], owner=ALICE)
    assert await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]


async def test_done_keys_expire_after_the_window(harness: Harness) -> None:
    store = harness.make(window=SHORT_LEASE)
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    await store.commit(["m1"], owner=ALICE)
    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.DONE]

    await harness.advance(PAST_SHORT_LEASE)

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]


async def test_the_window_accepts_a_timedelta(harness: Harness) -> None:
    store = harness.make(window=timedelta(milliseconds=100))
    await store.commit(["m1"], owner=ALICE)

    assert store.window == pytest.approx(0.1)
    await harness.advance(PAST_SHORT_LEASE)
    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]


# ------------------------------------------------------------------------ round trips


async def test_each_call_is_one_round_trip_however_many_keys(store: SeenSet) -> None:
    keys = [f"m{n}" for n in range(500)]
    await store.claim(["warm-up"], owner=ALICE, lease=LONG_LEASE)  # loads the script
    before = store.round_trips

    states = await store.claim(keys, owner=ALICE, lease=LONG_LEASE)
    assert store.round_trips == before + 1
    assert states == [ClaimState.CLAIMED] * 500
    assert await store.extend(keys, owner=ALICE, lease=LONG_LEASE) == [True] * 500
    assert store.round_trips == before + 2
    await store.release(keys[:250], owner=ALICE)
    assert store.round_trips == before + 3
    await store.commit(keys[250:], owner=ALICE)
    assert store.round_trips == before + 4

    assert await store.claim(keys, owner=BOB, lease=LONG_LEASE) == (
        [ClaimState.CLAIMED] * 250 + [ClaimState.DONE] * 250
    )


async def test_empty_calls_make_no_round_trip(store: SeenSet) -> None:
    before = store.round_trips

    assert await store.claim([], owner=ALICE, lease=LONG_LEASE) == []
    await store.commit([], owner=ALICE)
    await store.release([], owner=ALICE)
    assert await store.extend([], owner=ALICE, lease=LONG_LEASE) == []

    assert store.round_trips == before


# ---------------------------------------------------------------------- availability


async def each_update_raises(store: SeenSet, error: type[Exception]) -> None:
    """``commit``, ``release`` and ``extend`` of ``m1`` each raise ``error``."""
    with pytest.raises(error):
        await store.commit(["m1"], owner=ALICE)
    with pytest.raises(error):
        await store.release(["m1"], owner=ALICE)
    with pytest.raises(error):
        await store.extend(["m1"], owner=ALICE, lease=LONG_LEASE)


async def test_an_unavailable_store_raises_store_unavailable(harness: Harness) -> None:
    store = harness.make_unavailable()

    with pytest.raises(StoreUnavailableError) as info:
        await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    assert info.value.retryable
    assert "s3cret" not in str(info.value)
    await each_update_raises(store, StoreUnavailableError)
    # Nothing to ask, nothing to fail.
    assert await store.claim([], owner=ALICE, lease=LONG_LEASE) == []


async def test_in_memory_store_recovers_when_available_again() -> None:
    store = InMemorySeenSet(clock=FakeClock())
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    store.unavailable = True
    with pytest.raises(StoreUnavailableError, match="unavailable"):
        await store.commit(["m1"], owner=ALICE)

    store.unavailable = False

    assert await store.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.IN_FLIGHT]


# ------------------------------------------------------------------ configuration, close


@pytest.mark.parametrize("window", [0, -1.0, timedelta(0), float("inf")])
def test_a_useless_window_is_refused(harness: Harness, window: float | timedelta) -> None:
    with pytest.raises(ConfigurationError, match="window"):
        harness.make(window=window)


@pytest.mark.parametrize("lease", [0.0, -5.0])
async def test_a_useless_lease_is_refused(store: SeenSet, lease: float) -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        await store.claim(["m1"], owner=ALICE, lease=lease)
    with pytest.raises(ConfigurationError, match="lease"):
        await store.extend(["m1"], owner=ALICE, lease=lease)


async def test_every_call_after_aclose_raises_closed_error(store: SeenSet) -> None:
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    await store.aclose()
    await store.aclose()  # idempotent

    with pytest.raises(ClosedError):
        await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    with pytest.raises(ClosedError):
        await store.claim([], owner=ALICE, lease=LONG_LEASE)
    await each_update_raises(store, ClosedError)


async def test_async_with_closes_the_store(harness: Harness) -> None:
    async with harness.make() as store:
        await store.commit(["m1"], owner=ALICE)

    with pytest.raises(ClosedError):
        await store.commit(["m1"], owner=ALICE)


# --------------------------------------------------------------------- Redis specifics


async def layout_keys(
    client: redis.asyncio.Redis, prefix: str, key: str, hashes: int = 16_384
) -> dict[str, bytes]:
    """The keys under ``prefix`` (written for ``key`` alone), by kind, checked to be named
    ``prefix + group + ":{tag}:<hash>:..."``: the id's hash is its digest's first 32 bits
    modulo the hash count (16,384 for the default expected_ids)."""
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
    hash_number = int.from_bytes(digest[:4], "big") % hashes
    pattern = re.compile(
        re.escape(f"{prefix}default:".encode()) + rb"\{[0-9.]+\}:%d:(c|r|\d+)$" % hash_number
    )
    found: dict[str, bytes] = {}
    async for name in client.scan_iter(match=f"{prefix}*", count=1000):
        if name != f"{prefix}default:layout".encode():
            match = pattern.match(name)
            assert match, name
            found["bucket" if match.group(1).isdigit() else match.group(1).decode()] = name
    return found


async def test_redis_keeps_claims_and_done_ids_as_digest_fields_of_expiring_hashes(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    field = hashlib.blake2b(b"m1", digest_size=16).digest()[4:]
    try:
        async with RedisSeenSet(redis_client, prefix=prefix, window=600) as store:
            await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
            claims = (await layout_keys(redis_client, prefix, "m1"))["c"]
            deadline, _, holder = (await redis_client.hget(claims, field)).partition(b"|")
            assert holder == ALICE.encode()
            assert 0 < int(deadline) - time.time() * 1000 <= LONG_LEASE * 1000
            assert 0 < await redis_client.pttl(claims) <= 2 * LONG_LEASE * 1000

            before = int(time.time() * 1000) // 600_000
            await store.commit(["m1"], owner=ALICE)
            after = int(time.time() * 1000) // 600_000

        keys = await layout_keys(redis_client, prefix, "m1")
        assert set(keys) == {"bucket"}, "the claim went with the commit"
        bucket = keys["bucket"]
        assert int(bucket.rsplit(b":", 1)[1]) in (before, after)
        # Done: the window's end in units of window // 2048 ms (292), counted from the
        # bucket's start: a commit in the bucket's last 1.5 s counts up to 2055 of them.
        unit = 600_000 // 2048
        assert 0 <= int(await redis_client.hget(bucket, field)) <= -(-600_000 // unit)
        assert 600_000 <= await redis_client.pttl(bucket) <= 1_200_300
        assert await redis_client.object("encoding", bucket) == b"listpack"
    finally:
        await delete_prefix(redis_client, prefix)


async def test_redis_reads_the_previous_layouts_keys_until_they_expire(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    def legacy(key: str) -> bytes:  # one string key per id, as georep wrote them before
        return f"{prefix}default:".encode() + hashlib.blake2b(key.encode(), digest_size=16).digest()

    for key, value in [("done", "1"), ("deferred", "F"), ("dead", "Dbad order"), ("held", "cbob")]:
        await redis_client.set(legacy(key), value, px=60_000)
    keys = ["done", "deferred", "dead", "held", "new"]
    try:
        async with RedisSeenSet(redis_client, prefix=prefix) as store:
            claims = await store.claim(keys, owner=ALICE, lease=LONG_LEASE)
        async with RedisSeenSet(redis_client, prefix=prefix, read_legacy_keys=False) as store:
            upgraded = await store.claim(keys[:3], owner=ALICE, lease=LONG_LEASE)
    finally:
        await delete_prefix(redis_client, prefix)

    assert claims == [
        ClaimState.DONE,
        ClaimState.DEFERRED,
        ClaimState.DEAD_LETTERED,
        ClaimState.IN_FLIGHT,
        ClaimState.CLAIMED,
    ]
    assert isinstance(claims, Claims) and claims.reasons == {2: "bad order"}
    assert upgraded == [ClaimState.CLAIMED] * 3


@pytest.mark.parametrize("skew", [-1.0, 1.0], ids=["behind", "ahead"])
async def test_redis_finds_entries_of_a_receiver_whose_clock_is_off(
    redis_client: redis.asyncio.Redis, prefix: str, skew: float
) -> None:
    async with (
        RedisSeenSet(redis_client, prefix=prefix, window=60) as ours,
        RedisSeenSet(redis_client, prefix=prefix, window=60) as skewed,
    ):
        # A whole window off (60 s): the other receiver always picks the bucket next to
        # ours (the store reads the buckets either side of its own).
        skewed._wall_clock_ms = lambda: int((time.time() + skew * 60) * 1000)
        await skewed.claim(["held"], owner=BOB, lease=LONG_LEASE)
        await skewed.commit(["done"], owner=BOB, outcome=ClaimState.DEFERRED)
        await ours.commit(["mine"], owner=ALICE)

        assert await ours.claim(["held", "done"], owner=ALICE, lease=LONG_LEASE) == [
            ClaimState.IN_FLIGHT,
            ClaimState.DEFERRED,
        ]
        assert await skewed.claim(["mine"], owner=BOB, lease=LONG_LEASE) == [ClaimState.DONE]
    await delete_prefix(redis_client, prefix)


async def test_redis_drops_a_claim_nobody_came_back_for(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    async with RedisSeenSet(redis_client, prefix=prefix, expected_ids=1) as store:
        await store.claim(["live"], owner=ALICE, lease=LONG_LEASE)  # keeps the hash
        await store.claim(["abandoned"], owner=BOB, lease=SHORT_LEASE)
        # expected_ids=1: a single hash, so a single claims hash holds both.
        claims = (await layout_keys(redis_client, prefix, "live", hashes=1))["c"]
        await asyncio.sleep(PAST_SHORT_LEASE)
        assert await redis_client.hlen(claims) == 2

        # Each call looks at one claim at random: one in two finds the abandoned one.
        for _ in range(60):
            await store.claim(["live"], owner=ALICE, lease=LONG_LEASE)
            if await redis_client.hlen(claims) == 1:
                break

        assert await redis_client.hkeys(claims) == [
            hashlib.blake2b(b"live", digest_size=16).digest()[4:]
        ]
    await delete_prefix(redis_client, prefix)


async def test_redis_refuses_a_store_sized_otherwise_than_its_group(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    async with RedisSeenSet(redis_client, prefix=prefix, expected_ids=1_000_000) as first:
        await first.commit(["m1"], owner=ALICE)
    layout = f"{prefix}default:layout"
    assert await redis_client.get(layout) == b"hashes=16384 groups=16"
    assert 3 * 86_400_000 - 60_000 < await redis_client.pttl(layout) <= 3 * 86_400_000
    async with RedisSeenSet(redis_client, prefix=prefix, expected_ids=10_000_000) as other:
        with pytest.raises(ConfigurationError, match="same expected_ids"):
            await other.claim(["m1"], owner=BOB, lease=LONG_LEASE)
    async with RedisSeenSet(redis_client, prefix=prefix, expected_ids=1_000_001) as same:
        # 1,000,001 ids also need 16,384 hashes (a power of two): the same layout.
        assert await same.claim(["m1"], owner=BOB, lease=LONG_LEASE) == [ClaimState.DONE]
    await delete_prefix(redis_client, prefix)


async def test_redis_refuses_a_useless_expected_ids(redis_client: redis.asyncio.Redis) -> None:
    with pytest.raises(ConfigurationError, match="expected_ids"):
        RedisSeenSet(redis_client, expected_ids=0)


async def test_redis_groups_do_not_see_each_other(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    async with (
        RedisSeenSet(redis_client, group="orders", prefix=prefix) as orders,
        RedisSeenSet(redis_client, group="invoices", prefix=prefix) as invoices,
    ):
        await orders.commit(["m1"], owner=ALICE)

        assert await invoices.claim(["m1"], owner=ALICE, lease=LONG_LEASE) == [ClaimState.CLAIMED]
        assert await orders.claim(["m1"], owner=ALICE, lease=LONG_LEASE) == [ClaimState.DONE]
    await delete_prefix(redis_client, prefix)


async def test_redis_store_leaves_a_client_passed_in_open(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisSeenSet(redis_client, prefix=prefix)
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)

    await store.aclose()

    assert await redis_client.ping()
    await delete_prefix(redis_client, prefix)


@pytest.mark.parametrize("build", ["from_url", "constructor"])
async def test_redis_store_from_a_url_closes_the_client_it_created(
    redis_client: redis.asyncio.Redis, prefix: str, build: str
) -> None:
    if build == "from_url":
        store = RedisSeenSet.from_url(REDIS_URL, prefix=prefix)
    else:  # a URL given to the constructor, as before from_url existed
        store = RedisSeenSet(REDIS_URL, prefix=prefix)
    await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
    connection_id = await store._redis.client_id()
    assert await redis_client.client_list(client_id=[connection_id])

    await store.aclose()

    for _ in range(100):  # the server drops the connection once it reads the close
        if not await redis_client.client_list(client_id=[connection_id]):
            break
        await asyncio.sleep(0.02)
    assert not await redis_client.client_list(client_id=[connection_id])
    await delete_prefix(redis_client, prefix)


async def test_redis_store_on_a_decoding_client_reads_dead_letter_reasons(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    skip_unless_redis_answers()
    decoding = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        store = RedisSeenSet(decoding, prefix=prefix)
        await store.commit(["m1"], owner=ALICE, outcome=ClaimState.DEAD_LETTERED, reasons=["r"])
        claims = await store.claim(["m1", "m2"], owner=BOB, lease=LONG_LEASE)
        assert claims == [ClaimState.DEAD_LETTERED, ClaimState.CLAIMED]
        assert isinstance(claims, Claims) and claims.reasons == {0: "r"}
    finally:
        await delete_prefix(redis_client, prefix)
        await decoding.aclose()


async def test_unreachable_redis_error_names_the_server_not_the_password() -> None:
    async with RedisSeenSet(UNREACHABLE_URL, operation_timeout=0.2) as store:
        with pytest.raises(StoreUnavailableError) as info:
            await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)

    message = str(info.value)
    assert "127.0.0.1:1" in message
    assert "s3cret" not in message
    assert "s3cret" not in repr(info.value.__cause__)
    assert isinstance(info.value.__cause__, redis.ConnectionError)


async def test_a_redis_that_never_answers_fails_within_the_operation_timeout() -> None:
    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts the connection, reads the commands, never answers
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with RedisSeenSet(f"redis://127.0.0.1:{port}/0", operation_timeout=0.2) as store:
            started = asyncio.get_running_loop().time()
            with pytest.raises(StoreUnavailableError, match=rf"127\.0\.0\.1:{port}.*0\.2 s"):
                await store.commit(["m1"], owner=ALICE)
            assert asyncio.get_running_loop().time() - started < 1.0
    finally:
        server.close()


async def test_an_answer_that_came_too_late_is_never_read_as_the_next_calls(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    # Redis answers the first call after the operation timeout: that call fails, and the
    # next one (another key, another answer) gets its own answer, not the late one.
    target = urlsplit(REDIS_URL)
    host, port = target.hostname or "127.0.0.1", target.port or 6379
    delays = [0.5]

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port)

        async def pump(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, slow: bool
        ) -> None:
            while data := await source.read(65536):
                if slow and delays:
                    await asyncio.sleep(delays.pop())
                sink.write(data)
                await sink.drain()
            sink.close()

        await asyncio.gather(
            pump(reader, upstream_writer, False),
            pump(upstream_reader, writer, True),
            return_exceptions=True,
        )

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    relay_port = server.sockets[0].getsockname()[1]
    try:
        url = f"redis://127.0.0.1:{relay_port}/0"
        async with RedisSeenSet(url, prefix=prefix, operation_timeout=0.2) as store:
            with pytest.raises(StoreUnavailableError, match=r"0\.2 s"):
                await store.claim(["first"], owner=ALICE, lease=LONG_LEASE)
            await store.commit(["done"], owner=ALICE)
            assert await store.peek(["done", "never"]) == [ClaimState.DONE, None]
    finally:
        server.close()
    await delete_prefix(redis_client, prefix)


async def test_redis_store_reloads_its_script_after_a_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On the embedded server: SCRIPT FLUSH on a shared Redis would disturb other tests.
    monkeypatch.delenv("REDIS_URL", raising=False)
    url = await asyncio.to_thread(embedded_redis_url)
    assert url.startswith("unix://")
    assert embedded_redis_url() == url  # one server per process
    async with RedisSeenSet(url, prefix=f"test:{uuid.uuid4().hex}:") as store:
        await store.claim(["m1"], owner=ALICE, lease=LONG_LEASE)
        async with redis.asyncio.Redis.from_url(url) as admin:
            await admin.script_flush()
        before = store.round_trips

        states = await store.claim(["m1", "m2"], owner=BOB, lease=LONG_LEASE)

        assert states == [ClaimState.IN_FLIGHT, ClaimState.CLAIMED]
        assert store.round_trips == before + 3  # NOSCRIPT, SCRIPT LOAD, rerun
        await store.commit(["m2"], owner=BOB)
        assert store.round_trips == before + 4

        # A single call (one key, sent without a pipeline) reloads it the same way.
        async with redis.asyncio.Redis.from_url(url) as admin:
            await admin.script_flush()
        assert await store.claim(["m3"], owner=BOB, lease=LONG_LEASE) == [ClaimState.CLAIMED]
        assert store.round_trips == before + 7
        assert await store.peek(["m2", "m3"]) == [ClaimState.DONE, ClaimState.IN_FLIGHT]


def test_embedded_redis_url_prefers_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://example.invalid:6380/2")

    assert embedded_redis_url() == "redis://example.invalid:6380/2"


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_a_useless_operation_timeout_is_refused(timeout: float) -> None:
    with pytest.raises(ConfigurationError, match="operation_timeout"):
        RedisSeenSet("redis://127.0.0.1:6379/0", operation_timeout=timeout)


async def test_redis_one_script_call_serves_a_batch_over_every_slot_group(prefix: str) -> None:
    """On a single Redis a batch is one EVALSHA whatever groups its ids fall in, and each id
    is still kept in its own group's hashes (where a cluster's per-group calls put it)."""
    keys = [f"m{i}" for i in range(64)]
    digests = {key: hashlib.blake2b(key.encode(), digest_size=16).digest() for key in keys}

    def hash_of(key: str) -> int:
        return int.from_bytes(digests[key][:4], "big") & 16_383  # expected_ids 1,000,000

    assert len({hash_of(key) % 16 for key in keys}) == 16, "the ids cover every group"
    with private_redis_server() as url:
        client = redis.asyncio.Redis.from_url(url)
        try:
            async with RedisSeenSet(client, prefix=prefix) as store:
                await store.claim(["warm-up"], owner=ALICE, lease=LONG_LEASE)  # loads the script

                async def evalsha_calls() -> int:
                    stats = await client.info("commandstats")
                    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

                before = await evalsha_calls()
                assert await store.claim(keys, owner=ALICE, lease=LONG_LEASE) == [
                    ClaimState.CLAIMED
                ] * len(keys)
                await store.commit(keys[:32], owner=ALICE)
                assert await evalsha_calls() - before == 2

                for key in keys:
                    base = store._group_keys[hash_of(key) % 16] + b":%d:" % hash_of(key)
                    field = digests[key][4:]
                    if key in keys[:32]:
                        assert not await client.hexists(base + b"c", field), key
                    else:
                        assert await client.hexists(base + b"c", field), key
                assert (
                    await store.claim(keys, owner=BOB, lease=LONG_LEASE)
                    == [ClaimState.DONE] * 32 + [ClaimState.IN_FLIGHT] * 32
                )
        finally:
            await client.aclose()
