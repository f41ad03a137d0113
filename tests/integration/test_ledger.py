"""The ledger end to end: real SDK, the two-region emulator, a real Redis seen-set, pyarrow.

Concurrent passive sends through an outage, the ``@georep.receiver`` decorator on
connection strings, one ledger for both (``examples/ledger.py`` shows the class-based
GeoReceiver).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from _helpers import REDIS_URL, create_queue
from azure.servicebus import ServiceBusMessage

import georep
from georep import FailoverPolicy, GeoSender, ParquetLedger
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.ledger.schema import receive_schema, send_schema

pytestmark = pytest.mark.integration


async def test_a_passive_outage_midway_leaves_failover_rows_and_one_processed_row_per_id(
    georep_emulator_factory: Callable[..., Emulator], tmp_path: Path
) -> None:
    emu = georep_emulator_factory()
    # Short locks: a copy the primary locked for the receiver just as the outage began is
    # handed out again after its lock expires (as Azure does), not after the default minute.
    queue = create_queue(emu, "ledger", lock_duration=3)
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    seen = RedisSeenSet(REDIS_URL, group=f"ledger-test-{uuid.uuid4().hex[:8]}", window=600)
    ledger = ParquetLedger(tmp_path / "ledger", flush_rows=50, flush_interval=0.5)
    total, workers = 300, 6
    acknowledged: list[str] = []
    handled: Counter[str] = Counter()
    all_handled = asyncio.Event()
    next_index = iter(range(total))

    receiving_options: dict[str, Any] = {"seen": seen, "ledger": ledger, "max_wait": 0.5}

    @georep.receiver(primary=primary, secondary=secondary, queue_name=queue, **receiving_options)
    async def handle(message: Any) -> None:
        handled[str(message.message_id)] += 1
        if len(handled) == total:
            all_handled.set()

    async def worker(sender: GeoSender) -> None:
        for index in next_index:
            if index == total // 2:
                await asyncio.to_thread(emu.namespace("primary").outage)
            result = await sender.send_messages(ServiceBusMessage(f"m{index}"))
            acknowledged.extend(result.message_ids)

    async with ledger:
        receiving = asyncio.create_task(handle.run())
        async with GeoSender.from_connection_strings(
            primary,
            secondary,
            queue_name=queue,
            policy=FailoverPolicy(attempt_timeout=2.0),
            ledger=ledger,
        ) as sender:
            await asyncio.gather(*(worker(sender) for _ in range(workers)))
        # What the primary stored before its outage is received once it is back.
        await asyncio.to_thread(emu.namespace("primary").restore)
        await asyncio.wait_for(all_handled.wait(), timeout=90)
        await handle.aclose()
        await receiving
    await seen.aclose()

    sends = ds.dataset(tmp_path / "ledger" / "sends", schema=send_schema()).to_table()
    receives = ds.dataset(tmp_path / "ledger" / "receives", schema=receive_schema()).to_table()
    send_rows = sends.to_pylist()
    assert sorted(r["message_id"] for r in send_rows) == sorted(acknowledged)
    assert {r["outcome"] for r in send_rows} == {"accepted"}
    failovers = [r for r in send_rows if r["failover"]]
    assert failovers, "the send that met the outage is recorded as a failover"
    assert failovers[0]["accepted_region"] == "secondary"
    assert [a["region"] for a in failovers[0]["regions"]] == ["primary", "secondary"]
    assert failovers[0]["regions"][0]["outcome"] == "failed"
    assert {r["accepted_region"] for r in send_rows} == {"primary", "secondary"}

    receive_rows = receives.to_pylist()
    processed = Counter(r["message_id"] for r in receive_rows if r["outcome"] == "processed")
    assert processed == Counter(dict.fromkeys(acknowledged, 1)), "one processed row per id"
    assert processed == handled
    for row in receive_rows:
        assert row["received_at"] is not None and row["enqueued_at"] is not None
        assert row["settled_at"] is None or row["settled_at"] >= row["received_at"]
    assert len(list((tmp_path / "ledger" / "meta").glob("*.json"))) == 1
