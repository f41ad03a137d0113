"""Helpers the integration modules share: reading queues back, faults, waiting, sending.

Imported as ``from _helpers import ...`` (pytest puts this folder on ``sys.path``). The
fixtures (``emu``, ``private_queue``, ``seen``...) are in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from georep import GeoReceiver, GeoSender, PairedNamespaceOptions, ReplicationMode, Syphon
from georep.adapters.emulator import Emulator
from georep.adapters.redis import PrivateRedisCluster, private_redis_cluster
from georep.adapters.servicebus import ensure_backlog_queues

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
LOADED = 5.0
"""``operation_timeout`` of the Redis stores that tests use for what they store, not for
how fast: the role store's default (0.5 s) once ran out connecting to the shared Redis
while ten workers loaded two cores (test_role_store, a fresh-clone CI run)."""
REPO = Path(__file__).resolve().parents[2]
PACE = float(os.environ.get("GEOREP_TEST_PACE", "1"))
"""How much this machine stretches the bounds that detect a hang (tests/conftest.py's
``pace``): :func:`run_python`, :func:`eventually` and :func:`progressing` wait that many
times longer before they give up."""


def run_python(*args: str, timeout: float, **options: Any) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a new process from the checkout's root, its output captured as
    text; the exit status is the caller's to check. ``timeout`` is stretched by
    :data:`PACE`."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout * PACE,
        check=False,
        **options,
    )


@contextlib.asynccontextmanager
async def sdk_sender(
    connection_string: str, queue: str, **client_options: Any
) -> AsyncIterator[Any]:
    """The plain SDK's sender on ``queue`` (and its client) for the block; both closed after."""
    async with (
        ServiceBusClient.from_connection_string(connection_string, **client_options) as client,
        client.get_queue_sender(queue) as sender,
    ):
        yield sender


def on_emulator(cls: Any, emu: Emulator, queue: str, **options: Any) -> Any:
    """``cls.from_connection_strings(...)`` (a GeoSender, a GeoReceiver, their sync
    versions) on the emulator's two namespaces, for ``queue``."""
    return cls.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name=queue,
        **options,
    )


async def drain(
    emu: Emulator,
    namespace: str,
    queue: str,
    *,
    sub_queue: Any = None,
    wait: float = 1.0,
    known_count: bool = False,
) -> list[Any]:
    """Every message in ``queue`` of ``namespace`` (or its ``sub_queue``), received and
    deleted.

    Stops at the first receive that waits ``wait`` seconds for nothing; with
    ``known_count``, as soon as it has as many as the emulator stores (no final wait).
    """
    expected = emu.namespace(namespace).message_count(queue) if known_count else None
    messages: list[Any] = []
    async with (
        ServiceBusClient.from_connection_string(emu.connection_string(namespace)) as client,
        client.get_queue_receiver(
            queue,
            receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            sub_queue=sub_queue,
            prefetch_count=200 if known_count else 0,
        ) as receiver,
    ):
        while expected is None or len(messages) < expected:
            batch = await receiver.receive_messages(max_message_count=200, max_wait_time=wait)
            if not batch:
                break
            messages.extend(batch)
    return messages


async def drain_ids(
    emu: Emulator, namespace: str, queue: str, *, known_count: bool = True, wait: float = 2.0
) -> Counter[str]:
    """Every MessageId in ``queue`` of ``namespace``, received and deleted, with its count
    (see :func:`drain`)."""
    messages = await drain(emu, namespace, queue, known_count=known_count, wait=wait)
    return Counter(str(m.message_id) for m in messages)


async def fault(emu: Emulator, namespace: str, action: str, *args: object) -> None:
    """Inject a fault without blocking the event loop the SDK runs on."""
    await asyncio.to_thread(getattr(emu.namespace(namespace), action), *args)


async def fault_all(emu: Emulator, action: str) -> None:
    """:func:`fault` in every namespace of ``emu`` (``"outage"``: both regions down)."""
    for namespace in emu.namespaces:
        await fault(emu, namespace, action)


async def eventually(condition: Callable[[], bool | Awaitable[bool]], within: float) -> bool:
    """Wait until ``condition()`` holds (it is changed by tasks and processes we observe);
    ``condition`` may be a coroutine function. ``within`` is stretched by :data:`PACE`."""

    async def holds() -> bool:
        result = condition()
        return await result if inspect.isawaitable(result) else result

    deadline = time.monotonic() + within * PACE
    while not await holds():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def progressing(
    measure: Callable[[], int], target: int, *, stall: float, cap: float = 600.0
) -> bool:
    """Wait until ``measure()`` reaches ``target`` for as long as it keeps moving: False
    once it has not grown for ``stall`` seconds (the system is stuck, not slow), or after
    ``cap`` seconds in all. A loaded machine is slower, not stuck: tests that wait for a
    whole workload to finish use this rather than one budget for all of it. Both bounds
    are stretched by :data:`PACE`."""
    stall, cap = stall * PACE, cap * PACE
    last, moved = measure(), time.monotonic()
    ends = moved + cap
    while (now := measure()) < target:
        clock = time.monotonic()
        if now != last:
            last, moved = now, clock
        if clock - moved > stall or clock > ends:
            return False
        await asyncio.sleep(0.1)
    return True


class CountingHandler(Counter[str]):
    """A receiver's handler that only counts the messages it is given: a ``Counter`` of
    their message ids."""

    async def __call__(self, message: Any) -> None:
        self[str(message.message_id)] += 1


def stored(emu: Emulator, entity: str) -> int:
    """Messages ``entity`` holds, in all regions together."""
    return sum(emu.namespace(n).message_count(entity) for n in emu.namespaces)


async def send_active(emu: Emulator, count: int, **entity: str) -> list[str]:
    """Send ``count`` messages (bodies ``m0``, ``m1``...) to both regions in active mode, in
    batches of 100; their MessageIds. ``entity``: ``queue_name=`` or ``topic_name=``."""
    ids: list[str] = []
    async with GeoSender.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        mode=ReplicationMode.ACTIVE,
        **entity,
    ) as sender:
        for start in range(0, count, 100):
            batch = await sender.create_message_batch()
            for index in range(start, min(count, start + 100)):
                batch.add_message(ServiceBusMessage(f"m{index}"))
            ids.extend((await sender.send_messages(batch)).message_ids)
    return ids


async def drain_all_ids(
    emu: Emulator, queue: str, *, known_count: bool = True, wait: float = 2.0
) -> Counter[str]:
    """:func:`drain_ids` of ``queue`` in every region, added up."""
    ids: Counter[str] = Counter()
    for namespace in emu.namespaces:
        ids.update(await drain_ids(emu, namespace, queue, known_count=known_count, wait=wait))
    return ids


async def run_until(receiver: GeoReceiver, handler: Any, done: Callable[[], bool]) -> None:
    """Run ``receiver`` with ``handler`` until ``done()`` (asserted within 60 s), then close
    it and wait for ``run()`` to return."""
    task = asyncio.create_task(receiver.run(handler))
    try:
        assert await eventually(done, within=60), "the receiver did not finish in time"
    finally:
        await receiver.aclose()
        await task


def queue_fixture(prefix: str, **properties: Any) -> Any:
    """A fixture for a module on the module's private emulator (``emu``): a new queue for
    each test, made by the ``private_queue`` fixture. A module names it by assigning it,
    e.g. ``queue = queue_fixture("rx", lock_duration=5)``."""

    @pytest.fixture
    def fixture(private_queue: Callable[..., str]) -> str:
        return private_queue(prefix, **properties)

    return fixture


def create_queue(emu: Emulator, prefix: str = "q", **properties: Any) -> str:
    """Create a uniquely named queue (``prefix-`` and 8 hex digits) in every namespace."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(name, **properties)
    return name


def quick_paired_options(backlog_queue_count: int) -> PairedNamespaceOptions:
    """Paired-namespace options for a test: fail over at the first failure, ping the primary
    every second (5 s deadline), the syphon long-polling 1 s."""
    return PairedNamespaceOptions(
        backlog_queue_count=backlog_queue_count,
        failover_interval=0,
        ping_primary_interval=1,
        ping_timeout=5,
        syphon_long_poll=1,
    )


async def run_syphon(
    emu: Emulator,
    primary_name: str,
    options: PairedNamespaceOptions,
    done: Callable[[Syphon], bool],
) -> Syphon:
    """Run a syphon on the emulator's pair until ``done(syphon)`` (30 s at the most), then
    close it; returns it (its ``stats``)."""
    syphon = Syphon.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        primary_namespace=primary_name,
        options=options,
    )
    running = asyncio.create_task(syphon.run())
    started = time.monotonic()
    while not done(syphon):
        assert time.monotonic() - started < 30, f"syphon stuck: {syphon.stats}"
        await asyncio.sleep(0.1)
    await syphon.aclose()
    await asyncio.wait_for(running, 10)
    return syphon


async def backlog_queues(
    emu: Emulator, options: PairedNamespaceOptions, primary_name: str | None = None
) -> tuple[str, list[str]]:
    """Create the backlog queues ``options`` asks for in the secondary namespace.

    Backlog queues belong to a primary namespace, not to an entity: every paired sender of
    that namespace shares them. So the default name is a new one each call, which the
    test hands its senders (``primary_namespace=``): a module that borrows the emulator
    after another finds none of the other's backlog messages.

    Returns:
        The primary's name they are for and their paths.
    """
    name = primary_name or f"paired{uuid.uuid4().hex[:8]}"
    async with emu.async_admin_client("secondary") as admin:
        return name, await ensure_backlog_queues(admin, name, options)


_RECEIVER_PROCESS = """
import asyncio, os, signal, sys
from georep import GeoReceiver
from georep.adapters.redis import RedisSeenSet

async def main():
    seen = RedisSeenSet(
        os.environ["REDIS_URL"], group=os.environ["GROUP"], window=600,
        cluster=bool(os.environ.get("REDIS_CLUSTER")),
    )
    receiver = GeoReceiver.from_connection_strings(
        os.environ["PRIMARY"], os.environ["SECONDARY"], queue_name=os.environ["QUEUE"],
        seen=seen, lease=float(os.environ.get("LEASE", "30")),
    )
    slow = os.environ.get("SLOW_ID")

    async def handle(message):
        message_id = str(message.message_id)
        if message_id == slow:
            print("SLOW " + message_id, flush=True)
            await asyncio.sleep(3600)
        print(message_id, flush=True)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(receiver.aclose()))
    print("READY", flush=True)
    await receiver.run(handle)
    await seen.aclose()

asyncio.run(main())
"""


async def start_child(
    code: str, emu: Emulator, queue: str, **env: str
) -> asyncio.subprocess.Process:
    """``python -c code`` from the checkout's root, its output and errors piped; its
    environment has the regions' connection strings (``PRIMARY``, ``SECONDARY``), ``QUEUE``
    and ``env``."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=REPO,
        env={
            **os.environ,
            "PRIMARY": emu.connection_string("primary"),
            "SECONDARY": emu.connection_string("secondary"),
            "QUEUE": queue,
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def start_receiver(emu: Emulator, queue: str, group: str, **env: str) -> Any:
    """A receiver process (``_RECEIVER_PROCESS``) in seen-set group ``group``; ``env`` may
    override its variables (``REDIS_URL``...)."""
    variables = {"REDIS_URL": REDIS_URL, "GROUP": group, **env}
    return await start_child(_RECEIVER_PROCESS, emu, queue, **variables)


async def collect(process: Any, lines: list[str]) -> None:
    assert process.stdout is not None
    async for raw in process.stdout:
        lines.append(raw.decode().strip())


async def run_four_receivers(
    emu: Emulator, queue: str, group: str, *, within: float = 240, **env: str
) -> list[list[str]]:
    """Four receiver processes (:func:`start_receiver`) on ``queue`` until it is empty
    (asserted within ``within`` s), then SIGTERM; each one's printed lines."""
    processes = [await start_receiver(emu, queue, group, **env) for _ in range(4)]
    outputs: list[list[str]] = [[] for _ in processes]
    readers = [
        asyncio.create_task(collect(p, out)) for p, out in zip(processes, outputs, strict=True)
    ]
    try:
        assert await eventually(lambda: stored(emu, queue) == 0, within=within), (
            f"{stored(emu, queue)} copies left"
        )
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
        await asyncio.gather(*readers)
    return outputs


def assert_each_processed_once_by_all(outputs: list[list[str]], ids: list[str]) -> None:
    """Every id printed exactly once over all ``outputs``, and every process did some."""
    processed = Counter(line for out in outputs for line in out if line != "READY")
    assert set(processed) == set(ids), "every logical message was processed"
    assert max(processed.values()) == 1, "no message was processed twice"
    assert all("READY" in out for out in outputs)
    assert all(sum(1 for line in out if line != "READY") > 0 for out in outputs), (
        "work was spread over the four processes"
    )


def fresh_redis_cluster() -> Iterator[PrivateRedisCluster]:
    """A Redis Cluster of 3 masters and 3 replicas (``private_redis_cluster``) for as long
    as the generator runs; skips the test when redis-server or redis-cli is missing."""
    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        pytest.skip("a Redis Cluster test needs redis-server and redis-cli on PATH")
    with private_redis_cluster(3, replicas=1) as cluster:
        yield cluster
