"""Emulator throughput through the real async azure-servicebus SDK on loopback.

Prints msg/s for: single awaited sends, batches of 100 (pre-built, and built in the loop),
receive(100) + complete, and receive-and-delete; for one client process and for several
client processes at once (the SDK is pure Python, so one client process is CPU-bound
before the emulator is); and the emulator process's CPU share (1.0 = one core busy).
Ratios are against the naive-server baseline in shared/EMULATOR_NOTES.md.

    .venv/bin/python benchmarks/emulator_throughput.py [--messages 20000] [--clients 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from _record import write_record
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from georep.adapters.emulator import Emulator

BODY = b"x" * 200
# Naive-server figures, msg/s (shared/EMULATOR_NOTES.md): 2 cores, 200-byte bodies, one client.
BASELINE = {
    "single awaited sends": 1_700,
    "batches of 100 (pre-built)": 10_700,
    "batches of 100 (built in loop)": 10_700,
    "receive(100) + complete": 1_600,
    "receive-and-delete": 7_900,
}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Window = tuple[float, float, float, float]  # wall start, wall end, emulator CPU start, end


class _Timer:
    """Wall clock and the emulator's CPU seconds around the measured loop only."""

    def __init__(self, emulator_pid: int) -> None:
        self.pid = emulator_pid

    def __enter__(self) -> _Timer:
        self.start, self.cpu_start = time.time(), _cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.end, self.cpu_end = time.time(), _cpu_seconds(self.pid)

    @property
    def window(self) -> Window:
        return (self.start, self.end, self.cpu_start, self.cpu_end)


async def _send_single(conn: str, queue: str, count: int, pid: int) -> Window:
    async with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_sender(queue) as sender,
    ):
        await sender.send_messages(ServiceBusMessage(BODY))  # warm up the link
        with _Timer(pid) as timer:
            for _ in range(count):
                await sender.send_messages(ServiceBusMessage(BODY))
        return timer.window


async def _send_batches(conn: str, queue: str, count: int, pid: int, prebuilt: bool) -> Window:
    async with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_sender(queue) as sender,
    ):
        batch = await sender.create_message_batch()
        for _ in range(100):
            batch.add_message(ServiceBusMessage(BODY))
        await sender.send_messages(ServiceBusMessage(BODY))
        with _Timer(pid) as timer:
            for _ in range(count // 100):
                if prebuilt:
                    await sender.send_messages(batch)
                else:
                    await sender.send_messages([ServiceBusMessage(BODY) for _ in range(100)])
        return timer.window


async def _receive(conn: str, queue: str, count: int, pid: int, delete: bool) -> Window:
    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE if delete else ServiceBusReceiveMode.PEEK_LOCK
    async with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_receiver(queue, receive_mode=mode, prefetch_count=100) as receiver,
    ):
        got = 0
        with _Timer(pid) as timer:
            while got < count:
                messages = await receiver.receive_messages(max_message_count=100, max_wait_time=5)
                if not messages:
                    raise RuntimeError(f"queue ran dry after {got} of {count} messages")
                if not delete:
                    for message in messages:
                        await receiver.complete_message(message)
                got += len(messages)
        return timer.window


def _phase_in_process(phase: str, conn: str, queue: str, count: int, pid: int) -> Window:
    runners: dict[str, Callable[[], Coroutine[Any, Any, Window]]] = {
        "single awaited sends": lambda: _send_single(conn, queue, count, pid),
        "batches of 100 (pre-built)": lambda: _send_batches(conn, queue, count, pid, prebuilt=True),
        "batches of 100 (built in loop)": lambda: _send_batches(
            conn, queue, count, pid, prebuilt=False
        ),
        "receive(100) + complete": lambda: _receive(conn, queue, count, pid, delete=False),
        "receive-and-delete": lambda: _receive(conn, queue, count, pid, delete=True),
    }
    return asyncio.run(runners[phase]())


@dataclass
class Figure:
    phase: str
    clients: int
    messages: int
    wall: float
    emulator_cpu: float

    @property
    def rate(self) -> float:
        return self.messages / self.wall


def _prefill(conn: str, queue: str, count: int, pid: int) -> None:
    _phase_in_process("batches of 100 (pre-built)", conn, queue, count, pid)


def run(messages: int, clients: int) -> list[Figure]:
    figures: list[Figure] = []
    sizes = {
        "single awaited sends": max(500, messages // 10),
        "batches of 100 (pre-built)": messages,
        "batches of 100 (built in loop)": messages,
        "receive(100) + complete": max(1000, messages // 4),
        "receive-and-delete": messages,
    }
    with Emulator(namespaces=("primary",)) as emu, ProcessPoolExecutor(max_workers=clients) as pool:
        conn = emu.connection_string("primary")
        for n in sorted({1, clients}):
            for phase, count in sizes.items():
                queues = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(n)]
                for queue in queues:
                    emu.namespace("primary").create_queue(queue)
                    if phase.startswith("receive"):
                        _prefill(conn, queue, count, emu.pid)
                windows = list(
                    pool.map(
                        _phase_in_process,
                        [phase] * n,
                        [conn] * n,
                        queues,
                        [count] * n,
                        [emu.pid] * n,
                    )
                )
                # From the first client's start to the last client's end: setup is excluded.
                wall = max(w[1] for w in windows) - min(w[0] for w in windows)
                cpu = max(w[3] for w in windows) - min(w[2] for w in windows)
                figures.append(Figure(phase, n, count * n, wall, cpu / wall))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, default=20_000, help="messages per phase and client"
    )
    parser.add_argument(
        "--clients", type=int, default=2, help="client processes for the aggregate figures"
    )
    args = parser.parse_args()
    figures = run(args.messages, args.clients)
    print(
        "\nemulator throughput, real async SDK on loopback, 200-byte bodies,",
        f"{os.cpu_count()} cores",
    )
    header = f"{'phase':32} {'clients':>7} {'msg/s':>9} {'vs baseline':>11} {'emulator CPU':>12}"
    print(header)
    print("-" * len(header))
    for f in figures:
        ratio = f.rate / BASELINE[f.phase]
        print(
            f"{f.phase:32} {f.clients:>7} {f.rate:>9,.0f} {ratio:>10.2f}x {f.emulator_cpu:>11.0%}"
        )
    write_record(
        "emulator_throughput",
        quick=False,
        # against the rates recorded in BASELINE (this script's reference machine and code)
        ratios={f"{f.phase}, {f.clients} clients": f.rate / BASELINE[f.phase] for f in figures},
        figures={
            f"{f.phase}, {f.clients} clients": {
                "msg_per_s": round(f.rate),
                "emulator_cpu": round(f.emulator_cpu, 2),
            }
            for f in figures
        },
    )
    print("\nTimed from the first client's first message to the last client's last; connection")
    print(
        "setup excluded. Emulator CPU: its process's CPU seconds over that window (1.0 = a core)."
    )


if __name__ == "__main__":
    main()
