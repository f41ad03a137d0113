"""Seen-set throughput on one Redis node against a 3-shard Redis Cluster, same run.

Starts a throw-away ``redis-server`` and a throw-away cluster of ``--shards`` masters (no
replicas, so both sides do the same work per id; persistence off), then for 1, 4 and 8
client processes (``--processes``) has every process claim and commit ``--ids`` fresh ids
in batches of ``--batch`` through :class:`georep.adapters.redis.RedisSeenSet`, all starting
together. It prints claims+commits per second (one id claimed and committed = one) and the
cluster's ratio to the single node for the same number of processes.

Every process and server runs on this machine: with fewer cores than processes plus
shards, the figures show the client and server CPU this machine has, not what separate
hosts would give.

    .venv/bin/python benchmarks/redis_cluster.py [--ids 20000] [--batch 100]
        [--processes 1 4 8] [--shards 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from concurrent.futures import ProcessPoolExecutor

from _record import write_record

from georep.adapters.redis import RedisSeenSet, private_redis_cluster, private_redis_server
from georep.ports import ClaimState

OWNER = "benchmark"
LEASE = 30.0


def client_process(url: str, cluster: bool, ids: int, batch: int, start_at: float) -> float:
    """One client: waits for ``start_at`` (``time.time()``), then claims and commits ``ids``
    fresh ids; returns when it finished (``time.time()``)."""

    async def run() -> float:
        prefix = f"bench:{uuid.uuid4().hex[:8]}:"
        keys = [str(uuid.uuid4()) for _ in range(ids)]
        async with RedisSeenSet.from_url(
            url, cluster=cluster, prefix=prefix, window=600, operation_timeout=30.0
        ) as store:
            await store.claim(["warm-up"], owner=OWNER, lease=LEASE)  # connects, loads script
            await asyncio.sleep(max(0.0, start_at - time.time()))
            for start in range(0, ids, batch):
                chunk = keys[start : start + batch]
                states = await store.claim(chunk, owner=OWNER, lease=LEASE)
                assert states == [ClaimState.CLAIMED] * len(chunk), "fresh ids are claimable"
                await store.commit(chunk, owner=OWNER)
            return time.time()

    return asyncio.run(run())


def throughput(url: str, cluster: bool, processes: int, ids: int, batch: int) -> float:
    """Ids claimed and committed per second by ``processes`` clients together."""
    with ProcessPoolExecutor(processes) as pool:
        start_at = time.time() + 2.0 + 0.3 * processes  # every process connected by then
        futures = [
            pool.submit(client_process, url, cluster, ids, batch, start_at)
            for _ in range(processes)
        ]
        finished = max(future.result() for future in futures)
    return processes * ids / (finished - start_at)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=20_000, help="ids per client process")
    parser.add_argument("--batch", type=int, default=100, help="ids per claim and commit")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--shards", type=int, default=3, help="cluster masters")
    args = parser.parse_args()
    rows = []
    with private_redis_server() as single, private_redis_cluster(args.shards, replicas=0) as grid:
        for processes in args.processes:
            one = throughput(single, False, processes, args.ids, args.batch)
            many = throughput(grid.url, True, processes, args.ids, args.batch)
            print(f"{processes} processes: 1 node {one:,.0f}/s, {args.shards} shards {many:,.0f}/s")
            rows.append((processes, one, many))
    print(f"\nclaims+commits per second ({args.ids:,} ids per process, batches of {args.batch})")
    print(f"{'processes':>9} {'1 node':>10} {f'{args.shards} shards':>10} {'ratio':>6}")
    for processes, one, many in rows:
        print(f"{processes:>9} {one:>10,.0f} {many:>10,.0f} {many / one:>6.2f}")
    write_record(
        "redis_cluster",
        quick=False,
        ratios={
            f"{processes} processes: {args.shards} shards vs 1 node": many / one
            for processes, one, many in rows
        },
        figures={
            f"{processes} processes": {"one_node_per_s": round(one), "shards_per_s": round(many)}
            for processes, one, many in rows
        },
    )


if __name__ == "__main__":
    main()
