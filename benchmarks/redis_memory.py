"""Redis memory per processed message id in the seen-set (target: <= 150 bytes per id).

Commits ``--ids`` UUID4 ids through :class:`georep.adapters.redis.RedisSeenSet` (claim, then
commit, in batches of ``--batch``) under a prefix of its own, and reports:

- ``used_memory`` (``INFO memory``) after minus before, per id: everything the ids cost,
  main and expires hash tables included. On a Redis other clients write to at the same
  time this figure carries their noise; ``--private`` measures on a throw-away server.
- ``MEMORY USAGE`` of sample keys: key, value and main-dict entry only (Redis leaves out
  the key's entry in the expires dict and the hash-table buckets).

Every key it wrote is deleted before it exits.

    .venv/bin/python benchmarks/redis_memory.py [--ids 100000] [--batch 1000]
        [--url redis://127.0.0.1:6379/0 | --private]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import time
import uuid

import redis.asyncio

from georep.adapters.redis import RedisSeenSet, private_redis_server
from georep.ports import ClaimState

TARGET_BYTES_PER_ID = 150
OWNER = "benchmark"
LEASE = 30.0


async def used_memory(client: redis.asyncio.Redis) -> int:
    info = await client.info("memory")
    return int(info["used_memory"])


async def settled_used_memory(client: redis.asyncio.Redis) -> int:
    # Redis finishes growing a hash table incrementally (both tables exist meanwhile):
    # read until two readings a while apart agree, so the figure is the settled size.
    previous = await used_memory(client)
    for _ in range(20):
        await asyncio.sleep(0.25)
        current = await used_memory(client)
        if current == previous:
            break
        previous = current
    return previous


async def delete_prefix(client: redis.asyncio.Redis, prefix: str) -> int:
    deleted = 0
    batch: list[bytes] = []
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) == 1000:
            deleted += await client.unlink(*batch)
            batch = []
    if batch:
        deleted += await client.unlink(*batch)
    return deleted


async def measure(url: str, ids: int, batch: int) -> float:
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    group = "default"
    admin = redis.asyncio.Redis.from_url(url)
    store = RedisSeenSet(url, prefix=prefix, group=group, operation_timeout=30.0)
    server = await admin.info("server")
    memory_info = await admin.info("memory")
    print(
        f"redis {server['redis_version']} ({memory_info.get('mem_allocator', '?')}) at {url}, "
        f"{await admin.dbsize()} keys before"
    )
    try:
        await store.claim(["warm-up"], owner=OWNER, lease=LEASE)  # loads the script
        await store.release(["warm-up"], owner=OWNER)
        keys = [str(uuid.uuid4()) for _ in range(ids)]
        before = await settled_used_memory(admin)
        started = time.perf_counter()
        for start in range(0, ids, batch):
            chunk = keys[start : start + batch]
            states = await store.claim(chunk, owner=OWNER, lease=LEASE)
            assert states == [ClaimState.CLAIMED] * len(chunk), "fresh ids must be claimable"
            await store.commit(chunk, owner=OWNER)
        elapsed = time.perf_counter() - started
        after = await settled_used_memory(admin)
        per_id = (after - before) / ids

        sample = keys[:: max(1, ids // 1000)]

        def stored_key(key: str) -> bytes:  # as RedisSeenSet names it: prefix + digest
            return (
                f"{prefix}{group}:".encode()
                + hashlib.blake2b(key.encode(), digest_size=16).digest()
            )

        usages = [await admin.memory_usage(stored_key(key), samples=0) or 0 for key in sample]
        key_chars = len(stored_key(keys[0]))
        print(
            f"{ids:,} ids committed in {elapsed:.2f} s "
            f"({2 * ids / batch:,.0f} calls of {batch}, {ids / elapsed:,.0f} ids/s)"
        )
        print(f"used_memory: {before:,} -> {after:,} bytes = {per_id:.1f} bytes per id")
        print(
            f"MEMORY USAGE of a key ({key_chars}-byte key, value '1', PX TTL): "
            f"median {statistics.median(usages):.0f} bytes over {len(sample)} keys "
            "(without its expires-dict entry and hash-table buckets)"
        )
        verdict = "within" if per_id <= TARGET_BYTES_PER_ID else "ABOVE"
        print(f"target <= {TARGET_BYTES_PER_ID} bytes per id: {verdict}")
        return per_id
    finally:
        deleted = await delete_prefix(admin, prefix)
        print(f"cleaned up {deleted:,} keys under {prefix}")
        await store.aclose()
        await admin.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="Redis to measure on (default: $REDIS_URL, else the local one)",
    )
    where.add_argument(
        "--private", action="store_true", help="start a throw-away redis-server to measure on"
    )
    args = parser.parse_args()
    if args.private:
        with private_redis_server() as url:
            asyncio.run(measure(url, args.ids, args.batch))
    else:
        asyncio.run(measure(args.url, args.ids, args.batch))


if __name__ == "__main__":
    main()
