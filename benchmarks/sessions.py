"""Session mode: GeoReceiver(sessions=True) against the raw SDK's session receivers, and the
latency order restoration adds after a failover (docs/sessions.md), on the emulator and a
real Redis.

1. **Throughput.** The same sessions (``--sessions`` x ``--per-session`` messages, stamped
   by a passive GeoSender) drained by

   - raw SDK: ``--max-sessions`` tasks, each accepting ``NEXT_AVAILABLE_SESSION``, then
     ``receive_messages(50)`` and an awaited ``complete_message`` per message until the
     session is empty (one region, no dedup, no order across regions);
   - GeoReceiver in session mode, both regions, Redis seen-set, the same ``max_sessions``.

   It prints messages per second and the ratio GeoReceiver / raw (goal >= 0.8).
2. **Order restoration after a failover.** Half of every session is sent, the primary goes
   down, the other half goes to the secondary, and the primary comes back ``--outage``
   seconds later. For each message of the secondary whose predecessor was in the primary,
   the added latency is the time from the moment it could be handled (its receive, or the
   primary's return if later) to its handling: p50, p99 and max.

    .venv/bin/python benchmarks/sessions.py [--sessions 50] [--per-session 60]
    .venv/bin/python benchmarks/sessions.py --quick   # 10 x 30 messages, throughput only

It writes its figures to ``benchmarks/results/sessions.json`` (see ``benchmarks/_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from typing import Any

from _common import on_emulator
from _record import write_record
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import OperationTimeoutError

from georep import GeoReceiver, GeoSender
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.testing import InMemoryLedger

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def _queue(emu: Emulator) -> str:
    name = f"sessions-{uuid.uuid4().hex[:8]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(name, requires_session=True)
    return name


async def _fill(
    emu: Emulator, queue: str, sessions: int, rounds: range, sender: GeoSender | None = None
) -> None:
    async def send(geo: GeoSender) -> None:
        for number in rounds:
            await geo.send_messages(
                [ServiceBusMessage(f"s{s}:{number}", session_id=f"s{s}") for s in range(sessions)]
            )

    if sender is not None:
        await send(sender)
        return
    async with on_emulator(GeoSender, emu, queue) as geo:
        await send(geo)


async def _raw(emu: Emulator, queue: str, total: int, max_sessions: int) -> float:
    """Seconds the raw SDK's session receivers take to drain ``total`` messages."""
    handled = 0
    done = asyncio.Event()

    async def slot(client: ServiceBusClient) -> None:
        nonlocal handled
        while not done.is_set():
            try:
                async with client.get_queue_receiver(
                    queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.5
                ) as receiver:
                    while True:
                        batch = await receiver.receive_messages(
                            max_message_count=50, max_wait_time=0.5
                        )
                        if not batch:
                            break
                        for message in batch:
                            await receiver.complete_message(message)
                        handled += len(batch)
                        if handled >= total:
                            done.set()
            except OperationTimeoutError:
                continue  # no session free within max_wait_time

    async with ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client:
        started = time.perf_counter()
        slots = [asyncio.ensure_future(slot(client)) for _ in range(max_sessions)]
        await done.wait()
        elapsed = time.perf_counter() - started
        await asyncio.gather(*slots, return_exceptions=True)
    return elapsed


async def _geo(
    emu: Emulator, queue: str, total: int, max_sessions: int, **options: Any
) -> tuple[float, GeoReceiver, list[tuple[float, str]]]:
    """Seconds a session-mode GeoReceiver takes to handle ``total`` messages; the receiver
    and (handling time, body) per message."""
    handled: list[tuple[float, str]] = []
    done = asyncio.Event()
    seen = RedisSeenSet(REDIS_URL, group=f"bench-{uuid.uuid4().hex[:8]}", window=600)
    sessions = {"sessions": True, "max_sessions": max_sessions, "max_wait": 0.5}
    receiver = on_emulator(GeoReceiver, emu, queue, seen=seen, **sessions, **options)

    async def handle(message: Any) -> None:
        handled.append((time.time(), str(message)))
        if len(handled) >= total:
            done.set()

    started = time.perf_counter()
    running = asyncio.ensure_future(receiver.run(handle))
    await done.wait()
    elapsed = time.perf_counter() - started
    await receiver.aclose()
    await running
    await seen.aclose()
    return elapsed, receiver, handled


async def throughput(emu: Emulator, sessions: int, per_session: int, max_sessions: int) -> dict:
    total = sessions * per_session
    raw_queue, geo_queue = _queue(emu), _queue(emu)
    await _fill(emu, raw_queue, sessions, range(per_session))
    await _fill(emu, geo_queue, sessions, range(per_session))
    cpu_started = time.process_time()
    raw = await _raw(emu, raw_queue, total, max_sessions)
    raw_cpu = time.process_time() - cpu_started
    geo, _, _ = await _geo(emu, geo_queue, total, max_sessions)
    geo_cpu = time.process_time() - cpu_started - raw_cpu
    return {
        "messages": total,
        "raw_per_s": round(total / raw),
        "geo_per_s": round(total / geo),
        "ratio": round(raw / geo, 2),
        "cpu_us_per_message": {
            "raw": round(raw_cpu / total * 1e6),
            "geo": round(geo_cpu / total * 1e6),
        },
        "cpu_ratio": round(raw_cpu / geo_cpu, 2),
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def restoration(emu: Emulator, sessions: int, per_session: int, outage: float) -> dict:
    queue = _queue(emu)
    half = per_session // 2
    ledger = InMemoryLedger()
    async with on_emulator(GeoSender, emu, queue) as sender:
        await _fill(emu, queue, sessions, range(half), sender)
        await asyncio.to_thread(emu.namespace("primary").outage)
        await _fill(emu, queue, sessions, range(half, per_session), sender)

    async def restore_later() -> float:
        await asyncio.sleep(outage)
        await asyncio.to_thread(emu.namespace("primary").restore)
        return time.time()

    restoring = asyncio.ensure_future(restore_later())
    total = sessions * per_session
    _, receiver, handled = await _geo(emu, queue, total, 16, order_wait=outage + 60, ledger=ledger)
    restored_at = await restoring
    handled_at = {body: at for at, body in handled}
    # The new region's head of each session (its predecessor was in the primary).
    heads = {
        record.session_id: record.received_at
        for record in ledger.receives
        if record.outcome == "processed" and record.order_seq == half + 1
    }
    added = [
        handled_at[f"{session}:{half}"] - max(received, restored_at)
        for session, received in heads.items()
    ]
    return {
        "messages": total,
        "outage_s": outage,
        "order_gaps": receiver.stats.order_gaps,
        "heads_measured": len(added),
        "added_ms": {
            "p50": round(_percentile(added, 0.5) * 1000, 1),
            "p99": round(_percentile(added, 0.99) * 1000, 1),
            "max": round(max(added, default=0.0) * 1000, 1),
        },
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--per-session", type=int, default=60)
    parser.add_argument("--max-sessions", type=int, default=16)
    parser.add_argument("--outage", type=float, default=3.0)
    parser.add_argument(
        "--quick", action="store_true", help="10 sessions x 30 messages, throughput only"
    )
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.per_session, args.max_sessions = 10, 30, 8
    with Emulator() as emu:
        result = {
            "throughput": await throughput(emu, args.sessions, args.per_session, args.max_sessions),
        }
        if not args.quick:
            result["order_restoration"] = await restoration(
                emu, args.sessions, args.per_session, args.outage
            )
    print(json.dumps(result, indent=2))
    write_record(
        "sessions",
        quick=args.quick,
        ratios={
            "session GeoReceiver": result["throughput"]["ratio"],
            "cpu session GeoReceiver": result["throughput"]["cpu_ratio"],
        },
        cpu_per_message_us=result["throughput"]["cpu_us_per_message"],
        figures=result,
    )


if __name__ == "__main__":
    asyncio.run(main())
