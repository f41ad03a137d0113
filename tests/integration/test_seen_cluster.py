"""The Redis seen-set on a real Redis Cluster (3 masters, 3 replicas on loopback, started by
the test): load spread over the shards, four receiver processes, a master killed mid-run,
an unreachable cluster. The contract suite runs on the cluster too (test_seen_contract.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from _helpers import (
    assert_each_processed_once_by_all,
    eventually,
    fresh_redis_cluster,
    on_emulator,
    queue_fixture,
    run_four_receivers,
    send_active,
    stored,
)
from redis.crc import key_slot

from georep import GeoReceiver
from georep.adapters.emulator import Emulator
from georep.adapters.redis import PrivateRedisCluster, RedisSeenSet
from georep.adapters.redis._embedded import _free_port
from georep.ports import ClaimState

# A hang guard, not a budget: four receiver processes on a six-node cluster ran 126 s
# on a loaded machine, past pytest's default 120 s, while still making progress.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.redis_cluster,
    pytest.mark.heavy,
    pytest.mark.timeout(300),
]


queue = queue_fixture("cluster", lock_duration=5, max_delivery_count=10)


@pytest.fixture
def own_redis_cluster() -> Iterator[PrivateRedisCluster]:
    """A cluster for one test, which may kill its nodes."""
    yield from fresh_redis_cluster()


def masters(cluster: PrivateRedisCluster) -> list[int]:
    """The ports of the nodes that own slots now, as the first live node sees it (slot
    ownership, not the node flags: under load a replica's flags can lag its CLUSTER
    REPLICATE)."""
    return sorted({port for _, port in slot_owners(cluster).values()})


#: The store's bound on one call in the tests of where calls go (not how fast): the first
#: call to a new cluster (its slot map, a connection per master) took over the default 2 s
#: in a full run's first minutes on two cores.
ROUTING_TIMEOUT = 30.0


def keys_on(port: int, prefix: str) -> int:
    with redis.Redis(port=port) as node:
        return sum(1 for _ in node.scan_iter(match=f"{prefix}*", count=1000))


async def test_a_batch_spreads_over_every_shard_in_one_round_trip_per_call(
    redis_cluster: PrivateRedisCluster,
) -> None:
    prefix = f"spread:{uuid.uuid4().hex[:8]}:"
    keys = [f"id-{n}" for n in range(1_000)]
    async with RedisSeenSet.from_url(
        redis_cluster.url, cluster=True, prefix=prefix, operation_timeout=ROUTING_TIMEOUT
    ) as store:
        await store.claim(["warm-up"], owner="alice", lease=30)  # loads the script
        before = store.round_trips

        assert await store.claim(keys, owner="alice", lease=30) == [ClaimState.CLAIMED] * 1_000
        await store.commit(keys, owner="alice")

        assert store.round_trips - before == 2
        assert await store.claim(keys, owner="bob", lease=30) == [ClaimState.DONE] * 1_000
    per_master = [keys_on(port, prefix) for port in masters(redis_cluster)]
    assert len(per_master) == 3
    # Each id's hash tag picks its slot: about a third of the hashes on each master.
    assert all(count > 200 for count in per_master), per_master


def slot_owners(
    cluster: PrivateRedisCluster, port: int | None = None
) -> dict[int, tuple[str, int]]:
    """Each slot's master (node id, port), as the node on ``port`` (default: the first
    live one) sees it."""
    port = port or next(iter(cluster.processes))
    with redis.Redis(port=port, decode_responses=True) as node:
        shards = node.execute_command("CLUSTER", "SLOTS")
    owners: dict[int, tuple[str, int]] = {}
    for first, last, master, *_ in shards:
        for slot in range(first, last + 1):
            owners[slot] = (master[2], master[1])
    return owners


def cluster_ok(cluster: PrivateRedisCluster) -> bool:
    """Every node says ``cluster_state:ok``."""
    for port in cluster.processes:
        try:
            with redis.Redis(port=port, socket_timeout=1) as node:
                if node.cluster("INFO").get("cluster_state") != "ok":
                    return False
        except redis.RedisError:
            return False
    return True


def moved_answers(cluster: PrivateRedisCluster) -> int:
    total = 0
    for port in cluster.processes:
        with redis.Redis(port=port) as node:
            total += node.info("errorstats").get("errorstat_MOVED", {}).get("count", 0)
    return total


async def test_slots_moved_under_the_client_are_followed(
    own_redis_cluster: PrivateRedisCluster,
) -> None:
    cluster = own_redis_cluster
    keys = [f"id-{n}" for n in range(500)]
    async with RedisSeenSet.from_url(
        cluster.url, cluster=True, prefix="moved:", operation_timeout=ROUTING_TIMEOUT
    ) as store:
        await store.claim(["warm-up"], owner="alice", lease=30)  # caches the slot map
        await store.release(["warm-up"], owner="alice")
        # Every slot the store uses moves to one master (they are empty: no keys to
        # migrate), behind the client's back: its calls to the others first meet MOVED.
        owners = slot_owners(cluster)
        slots = sorted({key_slot(name) for name in store._group_keys})
        target = owners[slots[0]]
        moved = [slot for slot in slots if owners[slot] != target]
        masters_now = [target, *{owner for owner in owners.values() if owner != target}]
        # The new owner's epoch first becomes the highest, so that an old owner's gossip
        # cannot take a slot back before it hears of the move itself.
        with redis.Redis(port=target[1]) as node:
            node.execute_command("CLUSTER", "BUMPEPOCH")
        for slot in moved:
            for _, port in masters_now:  # the new owner first
                with redis.Redis(port=port) as node:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target[0])
        assert await eventually(
            lambda: all(
                all(view[slot] == target for slot in moved)
                for view in (slot_owners(cluster, port) for port in cluster.processes)
            ),
            within=10,
        ), "every node agrees on the new owner"

        claims = await store.claim(keys, owner="alice", lease=30)
        await store.commit(keys, owner="alice")
        again = await store.claim(keys, owner="bob", lease=30)

    assert moved_answers(cluster) > 0, "the client met MOVED"
    assert claims == [ClaimState.CLAIMED] * 500
    assert again == [ClaimState.DONE] * 500


async def test_four_receiver_processes_on_a_cluster_process_every_id_exactly_once(
    emu: Emulator, queue: str, redis_cluster: PrivateRedisCluster
) -> None:
    ids = await send_active(emu, 10_000, queue_name=queue)

    outputs = await run_four_receivers(
        emu, queue, f"four-{uuid.uuid4().hex[:8]}", REDIS_URL=redis_cluster.url, REDIS_CLUSTER="1"
    )

    assert_each_processed_once_by_all(outputs, ids)


async def test_a_master_killed_mid_run_processes_nothing_unchecked_and_loses_nothing(
    emu: Emulator, queue: str, own_redis_cluster: PrivateRedisCluster
) -> None:
    cluster = own_redis_cluster
    ids = await send_active(emu, 1_000, queue_name=queue)
    processed: Counter[str] = Counter()

    async def handle(message: Any) -> None:
        processed[str(message.message_id)] += 1
        await asyncio.sleep(0.002)

    seen = RedisSeenSet.from_url(cluster.url, cluster=True, window=600, operation_timeout=0.5)
    async with on_emulator(GeoReceiver, emu, queue, seen=seen, concurrency=8) as receiver:
        task = asyncio.create_task(receiver.run(handle))
        assert await eventually(lambda: sum(processed.values()) >= 200, within=60)
        victim = masters(cluster)[0]
        cluster.kill(victim)
        # Its replica takes over once the others have not heard from it for the node
        # timeout (1 s): three masters again, the victim not among them.
        assert await eventually(
            lambda: victim not in masters(cluster) and len(masters(cluster)) == 3, within=30
        )
        after_failover = sum(processed.values())
        assert await eventually(lambda: stored(emu, queue) == 0, within=120)
        await receiver.aclose()
        await task
    await seen.aclose()
    assert sum(processed.values()) > after_failover, "processing resumed on the new master"
    assert receiver.stats.unchecked == 0, "nothing was processed without a seen-set check"
    assert set(processed) == set(ids), "nothing was lost"
    assert max(processed.values()) == 1, processed.most_common(3)


async def test_an_unreachable_cluster_pauses_the_receiver_instead_of_crashing_it(
    emu: Emulator, queue: str
) -> None:
    await send_active(emu, 20, queue_name=queue)
    processed: list[str] = []

    async def handle(message: Any) -> None:
        processed.append(str(message.message_id))

    url = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there
    seen = RedisSeenSet.from_url(url, cluster=True, operation_timeout=0.3)
    async with on_emulator(GeoReceiver, emu, queue, seen=seen) as receiver:
        task = asyncio.create_task(receiver.run(handle))
        assert await eventually(lambda: receiver.stats.store_errors >= 2, within=30)
        assert not task.done(), "the receiver is still running, paused"
        await receiver.aclose()
        await task  # returns: no RedisClusterException escaped
    await seen.aclose()
    assert processed == []
    assert stored(emu, queue) == 40, "every copy is still queued for later"


async def test_doctor_checks_every_master_of_a_cluster_from_one_node_url(
    redis_cluster: PrivateRedisCluster,
) -> None:
    # Issue 28: `georep doctor --redis-url` with a cluster node's URL checked that one node
    # as if it were the whole seen-set. It now sees the cluster, its state and each master.
    from georep._doctor import Severity
    from georep.adapters.redis._doctor import check_seen_set_redis

    findings = await check_seen_set_redis(redis_cluster.url)
    text = [f.message for f in findings]
    assert any("Redis Cluster in state ok" in t for t in text), text
    checked = {t.split()[2] for t in text if t.startswith("cluster master") and "answers" in t}
    assert checked == {f"127.0.0.1:{port}" for port in masters(redis_cluster)}, text
    assert all(f.severity is not Severity.PROBLEM for f in findings), text


async def test_a_master_restarted_from_its_append_only_file_keeps_what_it_answered() -> None:
    """The soak's cluster (``--seen-set cluster``): no replicas, every write in the
    append-only file before the answer. A master killed and started again on its port
    rejoins as itself, and every id committed before the kill is still done; while it is
    down the store says so (StoreUnavailableError), it does not answer wrongly."""
    from georep.adapters.redis import private_redis_cluster
    from georep.exceptions import StoreUnavailableError

    keys = [f"id-{n}" for n in range(300)]
    with private_redis_cluster(
        3, "--appendonly", "yes", "--appendfsync", "always", replicas=0, node_timeout=1.0
    ) as cluster:
        async with RedisSeenSet.from_url(
            cluster.url, cluster=True, operation_timeout=ROUTING_TIMEOUT
        ) as store:
            await store.claim(keys, owner="alice", lease=30)
            await store.commit(keys, owner="alice")
            victim = masters(cluster)[1]
            cluster.kill(victim)
            down = RedisSeenSet.from_url(cluster.url, cluster=True, operation_timeout=3.0)
            with pytest.raises(StoreUnavailableError):
                async with down:
                    await down.claim(keys, owner="bob", lease=30)
            cluster.restart(victim)
            assert await eventually(lambda: cluster_ok(cluster), within=60)
            states = await store.claim(keys, owner="bob", lease=30)
    assert states == [ClaimState.DONE] * len(keys)
    assert set(cluster.ports) == {*cluster.processes}  # every node ran until the end
