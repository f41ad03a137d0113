"""The delivery ledger: send through an outage, receive once, read the ledger back.

Runnable: ``python examples/ledger.py`` (starts its own two-region emulator; uses
``$REDIS_URL`` or an embedded Redis). Writes the ledger to a temporary directory.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from azure.servicebus import ServiceBusMessage

from georep import FailoverPolicy, GeoReceiver, GeoSender, ParquetLedger
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet, embedded_redis_url
from georep.ledger.schema import receive_schema, send_schema

QUEUE = "orders"
MESSAGES = 40


async def run(emu: Emulator, directory: Path, redis_url: str) -> None:
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    handled: Counter[str] = Counter()
    all_handled = asyncio.Event()

    async def handle(message: Any) -> None:
        handled[str(message.message_id)] += 1
        if len(handled) == MESSAGES:
            all_handled.set()

    # The application owns the ledger and the seen-set; the sender and the receiver flush
    # the ledger when they close, and the ledger writes its last rows when it closes.
    async with (
        ParquetLedger(directory) as ledger,
        RedisSeenSet(redis_url, group=f"example-{uuid.uuid4().hex[:8]}") as seen,
        GeoSender.from_connection_strings(
            primary,
            secondary,
            queue_name=QUEUE,
            policy=FailoverPolicy(attempt_timeout=3.0),
            ledger=ledger,
        ) as sender,
        GeoReceiver.from_connection_strings(
            primary, secondary, queue_name=QUEUE, seen=seen, ledger=ledger
        ) as receiver,
    ):
        receiving = asyncio.create_task(receiver.run(handle))
        for index in range(MESSAGES):
            if index == MESSAGES // 2:
                # The control call blocks; keep it off the event loop the SDK runs on.
                await asyncio.to_thread(emu.namespace("primary").outage)
                print("primary namespace is down")
            await sender.send_messages(ServiceBusMessage(f"order {index}"))
        await asyncio.to_thread(emu.namespace("primary").restore)
        print("primary namespace is back: its stored messages are received too")
        await asyncio.wait_for(all_handled.wait(), timeout=60)
        await receiver.aclose()
        await receiving


def summarize(directory: Path) -> None:
    # Read with the contract's schemas (see docs/ledger.md §6).
    sends = ds.dataset(directory / "sends", schema=send_schema()).to_table().to_pylist()
    receives = ds.dataset(directory / "receives", schema=receive_schema()).to_table().to_pylist()
    print(f"ledger: {len(sends)} send rows, {len(receives)} receive rows")
    by_region = Counter(row["accepted_region"] for row in sends)
    print(f"sends accepted per region: {dict(by_region)}")
    failover = next(row for row in sends if row["failover"])
    tried = ", ".join(f"{a['region']} {a['outcome']}" for a in failover["regions"])
    print(f"the send that met the outage: {tried}")
    outcomes = Counter((row["region"], row["outcome"]) for row in receives)
    print(f"received copies: {dict(outcomes)}")
    acknowledged = {row["message_id"] for row in sends if row["outcome"] != "failed"}
    processed = Counter(row["message_id"] for row in receives if row["outcome"] == "processed")
    if set(processed) != acknowledged or max(processed.values()) != 1:
        raise SystemExit("the ledger does not show every message processed exactly once")
    print(f"every one of the {len(acknowledged)} acknowledged messages was processed once")


async def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # failover warnings are the point, not noise
    redis_url = await asyncio.to_thread(embedded_redis_url)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "ledger"
        async with Emulator(namespaces=("primary", "secondary"), queues=(QUEUE,)) as emu:
            await run(emu, directory, redis_url)
        summarize(directory)


if __name__ == "__main__":
    asyncio.run(main())
