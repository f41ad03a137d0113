"""What several benchmarks share."""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from georep import GeoSender, ReplicationMode
from georep.adapters.emulator import Emulator

BODY = b"x" * 200

_V = TypeVar("_V")


def on_emulator(cls: Any, emu: Emulator, queue: str, **options: Any) -> Any:
    """``cls.from_connection_strings(...)`` (a GeoSender or a GeoReceiver) on the emulator's
    primary and secondary, for ``queue``."""
    primary, secondary = (emu.connection_string(name) for name in ("primary", "secondary"))
    return cls.from_connection_strings(primary, secondary, queue_name=queue, **options)


@contextlib.asynccontextmanager
async def sdk_senders(emu: Emulator, prefix: str) -> AsyncIterator[tuple[Any, Any]]:
    """A new queue (named ``prefix-...``) in every namespace, and the plain SDK's async
    sender on it in the primary and in the secondary, each with its own client; all closed
    after the block."""
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(queue)
    async with (
        ServiceBusClient.from_connection_string(emu.connection_string("primary")) as east,
        ServiceBusClient.from_connection_string(emu.connection_string("secondary")) as west,
        east.get_queue_sender(queue) as raw_east,
        west.get_queue_sender(queue) as raw_west,
    ):
        yield raw_east, raw_west


async def fill_active(emu: Emulator, queue: str, count: int, body: bytes = BODY) -> None:
    """Send ``count`` logical messages with active replication: a copy in each region."""
    async with on_emulator(GeoSender, emu, queue, mode=ReplicationMode.ACTIVE) as sender:
        per_batch = max(1, min(100, 200_000 // max(len(body), 1)))  # within 256 KB
        for start in range(0, count, per_batch):
            batch = await sender.create_message_batch()
            for _ in range(min(per_batch, count - start)):
                batch.add_message(ServiceBusMessage(body))
            await sender.send_messages(batch)


async def interleaved(
    variants: Mapping[str, _V],
    workloads: Mapping[str, tuple[int, Callable[[_V, int], Awaitable[Any]]]],
    chunks: int,
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Wall and CPU seconds per (workload, variant): each workload's ``total`` messages run
    in chunks, the variants taking turns, so that a machine that speeds up or slows down
    during the run (shared CPUs do) affects each of them alike. A warm-up of 100 first."""
    wall: dict[tuple[str, str], float] = {}
    cpu: dict[tuple[str, str], float] = {}
    for workload, (total, run) in workloads.items():
        per_chunk = max(100, total // chunks)
        for variant in variants.values():  # warm-up
            await run(variant, 100)
        for _ in range(max(1, total // per_chunk)):
            for name, variant in variants.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                await run(variant, per_chunk)
                key = (workload, name)
                wall[key] = wall.get(key, 0.0) + time.perf_counter() - started
                cpu[key] = cpu.get(key, 0.0) + time.process_time() - cpu_started
    return wall, cpu


def send_workload_arguments(description: str, messages: int, batches: int, chunks: int) -> Any:
    """An argument parser with the send-throughput options (``--messages``, ``--batches``,
    ``--chunks``) and these defaults; the caller adds its own options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--messages", type=int, default=messages, help="single sends per variant")
    parser.add_argument("--batches", type=int, default=batches, help="batches of 100 per variant")
    parser.add_argument("--chunks", type=int, default=chunks, help="turns per variant")
    return parser
