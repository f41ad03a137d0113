"""What a ParquetLedger costs senders and receivers, on the two-region emulator.

One run measures, through the real async SDK on loopback:

1. Send throughput (msg/s) of GeoSender passive and active, each without a ledger and with
   a ParquetLedger (``flush_rows=--flush-rows``, default flush interval), for single awaited
   sends and for batches of 100. The variants take turns in ``--chunks`` small chunks, so
   drift in machine speed hits them alike; the ratio is "with ledger / without" in the same
   run, in wall time and in the client process's CPU time.
2. Receiver throughput: the same number of copies (active mode: two per logical message)
   drained by a GeoReceiver (Redis seen-set) without and with a ledger, in alternating
   rounds; logical messages per second and the ratio.

3. The hot path alone, in process (in-memory regions, no network): microseconds per
   passive ``send_messages`` for GeoSender without a ledger, with a ParquetLedger, and the
   GeoSender of ``--baseline-rev`` (the code before the ledger existed, loaded from git),
   interleaved. "No ledger" against the baseline is the cost of the ledger hooks when no
   ledger is given.

Then it reads the ledger back with pyarrow and prints the rows, files and dropped counts,
so a ratio is never reported for a ledger that silently wrote nothing.

Target: with a ledger >= 0.95x without (the ledger stays off the hot path).

    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python benchmarks/ledger.py \\
        [--messages 4000] [--batches 40] [--chunks 20] [--receive 2000] [--rounds 3]
        [--baseline-rev be6e8a9]
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from _common import fill_active, interleaved, on_emulator, sdk_senders, send_workload_arguments
from _record import write_record
from azure.servicebus import ServiceBusMessage

from georep import GeoReceiver, GeoSender, ParquetLedger, ReplicationMode, RoleState
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.ledger.schema import receive_schema, send_schema
from georep.testing import FakeMessage, InMemoryRegionSender

BODY = b"x" * 200
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
REPO = Path(__file__).resolve().parents[1]

Run = Callable[[GeoSender, int], Awaitable[None]]


async def single_sends(sender: GeoSender, count: int) -> None:
    for _ in range(count):
        await sender.send_messages(ServiceBusMessage(BODY))


async def batch_sends(sender: GeoSender, count: int) -> None:
    for _ in range(max(1, count // 100)):
        batch = await sender.create_message_batch()
        for _ in range(100):
            batch.add_message(ServiceBusMessage(BODY))
        await sender.send_messages(batch)


async def send_throughput(
    emu: Emulator, ledger: ParquetLedger, messages: int, batches: int, chunks: int
) -> dict[str, float]:
    async with sdk_senders(emu, "ledger-bench") as (raw_east, raw_west):
        roles = RoleState(raw_east.fully_qualified_namespace)
        variants: dict[str, GeoSender] = {}
        for mode in (ReplicationMode.PASSIVE, ReplicationMode.ACTIVE):
            for with_ledger in (False, True):
                name = f"{mode.value}{' + ledger' if with_ledger else ''}"
                variants[name] = GeoSender(
                    raw_east,
                    raw_west,
                    mode=mode,
                    role_state=roles,
                    ledger=ledger if with_ledger else None,
                )
        for sender in variants.values():
            await sender.warm_up()
        workloads: dict[str, tuple[int, Run]] = {
            "single awaited sends": (messages, single_sends),
            "batches of 100": (batches * 100, batch_sends),
        }
        wall, cpu = await interleaved(variants, workloads, chunks)
        for sender in variants.values():
            await sender.aclose()

    print(f"\nSend throughput, variants interleaved in {chunks} chunks (200-byte bodies)")
    print(f"{'workload':22} {'GeoSender':18} {'msg/s':>9} {'x no ledger':>12} {'CPU x':>7}")
    ratios: dict[str, float] = {}
    for workload, (total, _) in workloads.items():
        for name in variants:
            key = (workload, name)
            base = (workload, name.removesuffix(" + ledger"))
            if key != base:
                ratios[f"send {workload}: {name}"] = wall[base] / wall[key]
            print(
                f"{workload:22} {name:18} {total / wall[key]:9,.0f}"
                f" {wall[base] / wall[key]:12.2f} {cpu[base] / cpu[key]:7.2f}"
            )
    return ratios


async def drain_once(emu: Emulator, queue: str, count: int, ledger: ParquetLedger | None) -> float:
    """Seconds a fresh GeoReceiver takes to handle ``count`` logical messages and settle
    every copy."""
    seen = RedisSeenSet(REDIS_URL, group=f"ledger-bench-{uuid.uuid4().hex[:8]}", window=600)
    handled = 0
    done = asyncio.Event()

    async def handle(message: Any) -> None:
        nonlocal handled
        handled += 1
        if handled == count:
            done.set()

    receiver = on_emulator(GeoReceiver, emu, queue, seen=seen, ledger=ledger, max_wait=0.2)
    started = time.perf_counter()
    task = asyncio.create_task(receiver.run(handle))
    await asyncio.wait_for(done.wait(), timeout=300)
    # Twins still in flight are settled (suppressed) before the clock stops. The
    # receiver's counters have no event to wait on.
    stats = receiver.stats
    while stats.processed + sum(stats.suppressed.values()) < 2 * count:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - started
    await receiver.aclose()
    await task
    await seen.aclose()
    return elapsed


async def receive_throughput(
    emu: Emulator, ledger: ParquetLedger, count: int, rounds: int
) -> dict[str, float]:
    queue = f"ledger-rx-{uuid.uuid4().hex[:6]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(queue)
    times: dict[str, float] = {"without ledger": 0.0, "with ledger": 0.0}
    for _ in range(rounds):
        for name in times:
            await fill_active(emu, queue, count)
            times[name] += await drain_once(
                emu, queue, count, ledger if name == "with ledger" else None
            )
    print(f"\nReceive throughput, {rounds} alternating rounds of {count} logical messages")
    print(f"{'GeoReceiver':16} {'msg/s':>9} {'x no ledger':>12}")
    for name, seconds in times.items():
        rate = rounds * count / seconds
        print(f"{name:16} {rate:9,.0f} {times['without ledger'] / seconds:12.2f}")
    return {"receive: GeoReceiver with ledger": times["without ledger"] / times["with ledger"]}


def sender_at(revision: str) -> Any:
    """The GeoSender class as it was at ``revision`` (its module loaded from git)."""
    source = subprocess.run(
        ["git", "show", f"{revision}:georep/send/sender.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("georep._sender_baseline")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{revision}:georep/send/sender.py", "exec"), module.__dict__)
    return module.GeoSender


async def hot_path(
    ledger: ParquetLedger, baseline_rev: str, sends: int, chunks: int
) -> dict[str, float]:
    def regions() -> tuple[InMemoryRegionSender, InMemoryRegionSender]:
        return InMemoryRegionSender("primary", "east"), InMemoryRegionSender("secondary", "west")

    variants: dict[str, Any] = {
        f"before the ledger ({baseline_rev})": sender_at(baseline_rev)(
            *regions(), role_state=RoleState("east")
        ),
        "no ledger": GeoSender(*regions(), role_state=RoleState("east")),
        "ParquetLedger": GeoSender(*regions(), role_state=RoleState("east"), ledger=ledger),
    }
    chunk_times: dict[str, list[float]] = {name: [] for name in variants}
    per_chunk = max(100, sends // chunks)
    names = list(variants)
    for turn in range(max(1, sends // per_chunk)):
        # The order rotates: no variant always runs right after another one's garbage.
        for name in names[turn % 3 :] + names[: turn % 3]:
            sender = variants[name]
            messages = [FakeMessage(BODY) for _ in range(per_chunk)]
            send = sender.send_messages
            started = time.perf_counter()
            for message in messages:
                await send(message)
            if sender.__dict__.get("ledger") is not None:
                # These sends never yield to the loop, so the flusher cannot run meanwhile:
                # the write is timed here instead, in full (in real use it overlaps I/O).
                await ledger.flush()
            chunk_times[name].append((time.perf_counter() - started) / per_chunk)
    # Medians of the chunks: other processes on a shared machine hit a few chunks hard.
    medians = {name: statistics.median(times) for name, times in chunk_times.items()}
    baseline = next(iter(medians.values()))
    print(f"\nHot path: passive send_messages to in-memory regions, {sends:,} sends each")
    print("(median of chunks; ParquetLedger: recording plus writing the files each chunk)")
    print(f"{'GeoSender':30} {'us/send':>8} {'x before':>9}")
    for name, seconds in medians.items():
        print(f"{name:30} {seconds * 1e6:8.2f} {baseline / seconds:9.2f}")
    return {name: seconds * 1e6 for name, seconds in medians.items()}


def report(ledger: ParquetLedger) -> None:
    directory = ledger.directory

    def rows(dataset: str, schema: Any) -> int:
        folder = directory / dataset
        return ds.dataset(folder, schema=schema).count_rows() if folder.is_dir() else 0

    sends, receives = rows("sends", send_schema()), rows("receives", receive_schema())
    files = sum(1 for _ in directory.glob("*/*.parquet"))
    dropped = f"dropped {ledger.dropped_sends} sends, {ledger.dropped_receives} receives"
    print(f"\nLedger: {sends:,} send rows, {receives:,} receive rows in {files} files; {dropped}")


async def main() -> None:
    parser = send_workload_arguments(__doc__.split("\n")[0], 4000, 40, 20)
    parser.add_argument("--receive", type=int, default=2000, help="messages per drain round")
    parser.add_argument("--rounds", type=int, default=3, help="drain rounds per variant")
    parser.add_argument("--flush-rows", type=int, default=10_000)
    parser.add_argument("--hot-sends", type=int, default=200_000, help="in-process sends each")
    parser.add_argument(
        "--baseline-rev", default="be6e8a9", help="git revision of the sender before the ledger"
    )
    args = parser.parse_args()
    logging.getLogger("georep").setLevel(logging.ERROR)
    with Emulator() as emu, tempfile.TemporaryDirectory() as scratch:
        ledger = ParquetLedger(Path(scratch) / "ledger", flush_rows=args.flush_rows)
        async with ledger:
            ratios = await send_throughput(emu, ledger, args.messages, args.batches, args.chunks)
            if args.receive:
                ratios |= await receive_throughput(emu, ledger, args.receive, args.rounds)
            hot = {}
            if args.hot_sends:
                hot = await hot_path(ledger, args.baseline_rev, args.hot_sends, args.chunks)
        report(ledger)
    write_record(
        "ledger",
        quick=False,
        ratios=ratios,
        cpu_per_message_us={f"hot path: {name}": us for name, us in hot.items()},
    )


if __name__ == "__main__":
    asyncio.run(main())
