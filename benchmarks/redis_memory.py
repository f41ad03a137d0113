"""Redis memory per remembered message id in the seen-set, old and new layouts side by side.

For each layout it writes ``--ids`` UUID4 ids as done, under a prefix of its own, and reads
``used_memory`` (``INFO memory``) before and after, per id: everything the ids cost, keys,
values, TTLs and hash tables included (target: <= 64 bytes per id). On a Redis other
clients write to at the same time this figure carries their noise; ``--private`` measures
on a throw-away server.

- ``one key per id``: the layout before georep 0.x, written as it left a done id (a string
  key ``prefix + group + ":" + digest``, value ``'1'``, ``PX`` = the window).
- ``hashes``: :class:`georep.adapters.redis.RedisSeenSet` today (claim, then commit, in
  batches of ``--batch``), once sized for the ids measured (``expected_ids=--ids``) and
  once with the default sizing (1,000,000 ids per window), which is too big for 100,000
  ids: there the per-hash overhead is shared by fewer ids.

The hashes hold an id for one to two windows (its time bucket expires as a whole), 1.5 on
average at a steady rate; the figure printed is per id held. Every key it wrote is deleted
before it exits.

    .venv/bin/python benchmarks/redis_memory.py [--ids 100000] [--batch 1000]
        [--url redis://127.0.0.1:6379/0 | --private]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio
from _record import write_record

from georep.adapters.redis import RedisSeenSet, private_redis_server
from georep.adapters.redis._seen import DEFAULT_EXPECTED_IDS
from georep.ports import ClaimState

TARGET_BYTES_PER_ID = 64
OWNER = "benchmark"
LEASE = 30.0
WINDOW_MS = 24 * 3600 * 1000


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


Writer = Callable[[list[str]], Awaitable[None]]


def one_key_per_id(admin: redis.asyncio.Redis, prefix: str) -> Writer:
    async def write(chunk: list[str]) -> None:
        pipe = admin.pipeline(transaction=False)
        for key in chunk:
            digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
            pipe.set(f"{prefix}default:".encode() + digest, b"1", px=WINDOW_MS)
        await pipe.execute()

    return write


def hashes(store: RedisSeenSet) -> Writer:
    async def write(chunk: list[str]) -> None:
        states = await store.claim(chunk, owner=OWNER, lease=LEASE)
        assert states == [ClaimState.CLAIMED] * len(chunk), "fresh ids must be claimable"
        await store.commit(chunk, owner=OWNER)

    return write


async def measure(admin: redis.asyncio.Redis, write: Writer, ids: int, batch: int) -> float:
    keys = [str(uuid.uuid4()) for _ in range(ids)]
    before = await settled_used_memory(admin)
    started = time.perf_counter()
    for start in range(0, ids, batch):
        await write(keys[start : start + batch])
    elapsed = time.perf_counter() - started
    after = await settled_used_memory(admin)
    print(f"    {ids:,} ids in {elapsed:.2f} s; used_memory {before:,} -> {after:,} bytes")
    return (after - before) / ids


async def compare(url: str, ids: int, batch: int) -> None:
    admin = redis.asyncio.Redis.from_url(url)
    server = await admin.info("server")
    memory_info = await admin.info("memory")
    print(
        f"redis {server['redis_version']} ({memory_info.get('mem_allocator', '?')}) at {url}, "
        f"{await admin.dbsize()} keys before"
    )
    results: list[tuple[str, float]] = []
    layouts: list[tuple[str, int | None]] = [
        ("one key per id (before)", None),
        (f"hashes, expected_ids={ids:,}", ids),
        (f"hashes, expected_ids={DEFAULT_EXPECTED_IDS:,} (default)", DEFAULT_EXPECTED_IDS),
    ]
    try:
        for name, expected in layouts:
            prefix = f"bench:{uuid.uuid4().hex[:8]}:"
            print(f"  {name}")
            if expected is None:
                per_id = await measure(admin, one_key_per_id(admin, prefix), ids, batch)
            else:
                async with RedisSeenSet(
                    url, prefix=prefix, expected_ids=expected, operation_timeout=30.0
                ) as store:
                    await store.claim(["warm-up"], owner=OWNER, lease=LEASE)  # loads the script
                    await store.release(["warm-up"], owner=OWNER)
                    per_id = await measure(admin, hashes(store), ids, batch)
            print(f"    cleaned up {await delete_prefix(admin, prefix):,} keys under {prefix}")
            results.append((name, per_id))
    finally:
        await admin.aclose()
    print(f"\n{'layout':<48} {'bytes per id':>12}  target <= {TARGET_BYTES_PER_ID}")
    for name, per_id in results:
        verdict = "within" if per_id <= TARGET_BYTES_PER_ID else "ABOVE"
        print(f"{name:<48} {per_id:>12.1f}  {verdict}")
    write_record(
        "redis_memory",
        quick=False,
        # one key per id / this layout, bytes per id: higher is better
        ratios={name: results[0][1] / per_id for name, per_id in results[1:]},
        figures={
            "redis": server["redis_version"],
            "ids": ids,
            "bytes_per_id": {name: round(per_id, 1) for name, per_id in results},
        },
    )


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
            asyncio.run(compare(url, args.ids, args.batch))
    else:
        asyncio.run(compare(args.url, args.ids, args.batch))


if __name__ == "__main__":
    main()
