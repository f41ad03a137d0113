"""Real SDK clients against the emulator: GeoSender open/close cycles leave nothing behind.

The unit test (tests/unit/test_telemetry_leaks.py) runs 200 cycles with in-memory regions;
this one runs fewer with the real azure-servicebus SDK, a real SQLite outbox and an SDK
MeterProvider, so the SDK's connections, threads and sockets are covered too.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import weakref
from pathlib import Path

import pytest
from _helpers import on_emulator
from azure.servicebus import ServiceBusMessage
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from georep import GeoSender, SqliteOutbox
from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

CYCLES = 20


def _sockets_and_files(caller_owned: Path) -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not target.startswith(str(caller_owned)):
            found.add(target)
    return found


async def _cycle(emu: Emulator, outbox: SqliteOutbox, provider: MeterProvider) -> GeoSender:
    sender = on_emulator(GeoSender, emu, "orders", outbox=outbox, meter_provider=provider)
    await sender.send_messages(ServiceBusMessage("x"))
    await sender.aclose()
    return sender


async def test_real_sdk_sender_cycles_leave_no_sender_task_thread_or_socket(
    georep_emulator: Emulator, tmp_path: Path
) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    outbox = SqliteOutbox(tmp_path / "outbox.db")
    await _cycle(georep_emulator, outbox, provider)  # warm-up: imports, first connection
    await asyncio.sleep(0.2)
    gc.collect()
    tasks, threads = len(asyncio.all_tasks()), threading.active_count()
    files = _sockets_and_files(tmp_path)
    refs = [weakref.ref(await _cycle(georep_emulator, outbox, provider)) for _ in range(CYCLES)]
    await outbox.depth("flush")
    await asyncio.sleep(0.2)  # the SDK closes its sockets from callbacks
    gc.collect()
    assert [ref for ref in refs if ref() is not None] == []
    assert len(asyncio.all_tasks()) == tasks
    assert threading.active_count() == threads
    assert _sockets_and_files(tmp_path) - files == set()
    depths = reader.get_metrics_data()
    names = {
        metric.name
        for resource in (depths.resource_metrics if depths else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.data.data_points
    }
    assert "georep.outbox.depth" not in names  # every sender closed: nothing to report
    await outbox.aclose()
