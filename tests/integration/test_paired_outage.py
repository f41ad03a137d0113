"""PairedSender through the real SDK: outage → backlog queues → ping → back to the primary."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _helpers import (
    backlog_queues,
    create_queue,
    drain,
    on_emulator,
    quick_paired_options,
    run_syphon,
    sdk_sender,
)
from azure.servicebus import ServiceBusMessage

from georep import (
    GeoReceiver,
    PairedNamespaceOptions,
    PairedSender,
    RegionError,
    backlog_queue_path,
)
from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import from_backlog
from georep.testing import InMemorySeenSet

pytestmark = pytest.mark.integration


async def back_on_primary(sender: PairedSender, within: float) -> bool:
    """Wait for the sender's background pinger to end failover."""
    deadline = time.monotonic() + within
    while sender.state.engaged:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_outage_sends_go_to_backlog_queues_until_a_ping_succeeds(emu: Emulator) -> None:
    queue = create_queue(emu, "paired")
    options = PairedNamespaceOptions(
        backlog_queue_count=2, failover_interval=1, ping_primary_interval=1, ping_timeout=5
    )
    primary_name, paths = await backlog_queues(emu, options)
    assert paths == [backlog_queue_path(primary_name, i) for i in range(2)]

    async with on_emulator(
        PairedSender, emu, queue, options=options, primary_namespace=primary_name
    ) as sender:
        assert await sender.send_messages(ServiceBusMessage("before")) == "primary"
        await asyncio.to_thread(emu.namespace("primary").outage)
        with pytest.raises(RegionError):
            await sender.send_messages(ServiceBusMessage("fails", session_id="s-1"))
        await asyncio.sleep(1.1)  # failover_interval passes with no successful send
        during = [ServiceBusMessage(f"during-{i}", session_id="s-1") for i in range(4)]
        places = [await sender.send_messages(m) for m in during]
        assert set(places) <= set(paths)

        await asyncio.to_thread(emu.namespace("primary").restore)
        assert await back_on_primary(sender, within=15)
        assert sender.pings >= 1
        assert await sender.send_messages(ServiceBusMessage("after")) == "primary"

    backlog = [m for path in paths for m in await drain(emu, "secondary", path)]
    assert sorted(str(m.message_id) for m in backlog) == sorted(str(m.message_id) for m in during)
    for message in backlog:
        destination, restored = from_backlog(message)
        assert destination == queue and restored.session_id == "s-1"
    in_primary = [b"".join(m.body) for m in await drain(emu, "primary", queue)]
    assert sorted(in_primary) == [b"after", b"before"], "pings are never delivered"


async def test_the_syphon_brings_backlog_messages_home_and_each_is_received_once(
    emu: Emulator,
) -> None:
    queue = create_queue(emu, "syphon")
    options = quick_paired_options(3)
    primary_name, _ = await backlog_queues(emu, options)

    async with on_emulator(
        PairedSender, emu, queue, options=options, primary_namespace=primary_name
    ) as sender:
        await asyncio.to_thread(emu.namespace("primary").outage)
        when = datetime.now(UTC) + timedelta(seconds=2)
        sent = [
            ServiceBusMessage(
                f"m{i}", time_to_live=timedelta(minutes=10), scheduled_enqueue_time_utc=when
            )
            for i in range(20)
        ]
        places = [await sender.send_messages(m) for m in sent]
        assert all(p != "primary" for p in places)
        await asyncio.to_thread(emu.namespace("primary").restore)
        assert await back_on_primary(sender, within=15)

    syphon = await run_syphon(emu, primary_name, options, lambda s: s.stats.moved >= len(sent))
    assert syphon.stats.moved >= len(sent) and syphon.stats.dead_lettered == 0

    await asyncio.sleep(2.5)  # the restored scheduled enqueue time passes
    for path in [backlog_queue_path(primary_name, i) for i in range(3)]:
        assert emu.namespace("secondary").message_count(path) == 0, "backlog drained"

    # Moving is at least once (a copy whose completion was lost moves again, same
    # MessageId): the receiver sees each message once.
    handled: Counter[str] = Counter()

    async def handle(message: Any) -> None:
        # Restored, less the time spent in the backlog after the schedule time (issue 14).
        ttl = message.time_to_live
        assert timedelta(minutes=9) < ttl <= timedelta(minutes=10), "TTL restored"
        handled[str(message.message_id)] += 1

    async with on_emulator(GeoReceiver, emu, queue, seen=InMemorySeenSet()) as receiver:
        task = asyncio.create_task(receiver.run(handle))
        started = time.monotonic()
        while emu.namespace("primary").message_count(queue):
            assert time.monotonic() - started < 30
            await asyncio.sleep(0.1)
        await receiver.aclose()
        await task
    assert handled == Counter({str(m.message_id): 1 for m in sent})


async def test_the_syphon_cli_moves_messages_and_stops_gracefully(emu: Emulator) -> None:
    import os
    import signal
    import subprocess
    import sys

    from georep.adapters.servicebus import to_backlog

    queue = create_queue(emu, "cli")
    options = PairedNamespaceOptions(backlog_queue_count=2)
    name, paths = await backlog_queues(emu, options, f"cli{uuid.uuid4().hex[:6]}")
    async with sdk_sender(emu.connection_string("secondary"), paths[1]) as sender:
        await sender.send_messages(to_backlog(ServiceBusMessage("home", message_id="h1"), queue))

    env = {
        **os.environ,
        "GEOREP_PRIMARY": emu.connection_string("primary"),
        "GEOREP_SECONDARY": emu.connection_string("secondary"),
        "GEOREP_PRIMARY_NAMESPACE": name,
        "GEOREP_BACKLOG_QUEUES": "2",
        "GEOREP_SYPHON_LONG_POLL": "1",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from georep.cli import main; main()",
        "syphon",
        "--report-every",
        "0.5",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        started = time.monotonic()
        while emu.namespace("primary").message_count(queue) == 0:
            assert time.monotonic() - started < 30, "the syphon did not move the message"
            await asyncio.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode()
    assert process.returncode == 0, text
    assert "syphon stopped" in text and "moved 1" in text
    assert "SharedAccessKey" not in text
    [home] = await drain(emu, "primary", queue)
    assert home.message_id == "h1"
