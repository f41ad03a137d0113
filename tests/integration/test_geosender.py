"""GeoSender through the real azure-servicebus SDK against the two-region emulator."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _helpers import (
    drain_all_ids,
    drain_ids,
    eventually,
    fault,
    fault_all,
    on_emulator,
    queue_fixture,
    start_child,
)
from azure.servicebus import ServiceBusMessage

from georep import (
    AllRegionsUnavailableError,
    AuthenticationError,
    DrainPolicy,
    EntityNotFoundError,
    ErrorKind,
    FailoverPolicy,
    GeoSender,
    InvalidMessageError,
    MessageTooLargeError,
    RegionUnavailableError,
    ReplicationMode,
    SqliteOutbox,
)
from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


queue = queue_fixture("geo")


async def outbox_emptied(outbox: SqliteOutbox, within: float = 30.0) -> bool:
    """Wait for the background drainer to empty ``outbox``: whether it did ``within``."""

    async def empty() -> bool:
        return await outbox.depth() == 0

    # The outbox is a file other processes may write too: polling it is the only way.
    return await eventually(empty, within)


@pytest.fixture
async def passive(emu: Emulator, queue: str) -> AsyncIterator[GeoSender]:
    async with on_emulator(
        GeoSender, emu, queue, policy=FailoverPolicy(attempt_timeout=2.0)
    ) as sender:
        yield sender


async def test_passive_outage_halfway_loses_nothing_and_swaps_once(
    emu: Emulator, queue: str, passive: GeoSender
) -> None:
    total, workers = 2000, 8
    sent: list[str] = []
    next_index = iter(range(total))

    async def worker() -> None:
        for index in next_index:
            if index == total // 2:
                await fault(emu, "primary", "outage")
            result = await passive.send_messages(ServiceBusMessage(f"m{index}"))
            sent.extend(result.message_ids)

    await asyncio.gather(*(worker() for _ in range(workers)))
    assert len(sent) == total
    assert passive.stats.role_swaps == 1 and passive.roles.swaps == 1
    assert passive.active_region == "secondary"

    await fault(emu, "primary", "restore")
    stored = await drain_all_ids(emu, queue)
    assert set(stored) == set(sent), "every acknowledged message is in one of the queues"
    assert stored.total() == total, "an outage (refused connection) creates no duplicates"


async def test_passive_blackhole_fails_over_within_the_attempt_deadline(
    emu: Emulator, queue: str, passive: GeoSender
) -> None:
    await fault(emu, "primary", "blackhole")
    result = await passive.send_messages(ServiceBusMessage("during"))

    assert result.failed_over and result.accepted == ("secondary",)
    # georep's own attempt deadline ended the primary's attempt (a blackhole never answers:
    # without it the send would wait for the SDK's own minute-long timeout). How long the
    # failover takes is measured by benchmarks/sender.py, not asserted here.
    cause = result.failed["primary"]
    assert isinstance(cause, RegionUnavailableError) and cause.kind is ErrorKind.TIMEOUT
    assert "within 2 s" in str(cause), cause
    await fault(emu, "primary", "restore")
    assert set(await drain_ids(emu, "secondary", queue)) == set(result.message_ids)


async def test_switch_back_waits_for_the_old_active_to_answer(emu: Emulator, queue: str) -> None:
    policy = FailoverPolicy(
        attempt_timeout=2.0, switch_back=True, switch_back_probe_interval=0.3, failback_after=0.6
    )
    async with on_emulator(GeoSender, emu, queue, policy=policy) as sender:
        await fault(emu, "primary", "outage")
        assert (await sender.send_messages(ServiceBusMessage("m"))).failed_over
        await asyncio.sleep(1.5)  # several probes meet the outage: roles stay swapped
        assert sender.active_region == "secondary" and sender.stats.role_swaps == 1

        await fault(emu, "primary", "restore")
        assert await eventually(lambda: sender.active_region == "primary", within=10)
        assert sender.stats.role_swaps == 2
        result = await sender.send_messages(ServiceBusMessage("back"))
        assert result.accepted == ("primary",) and not result.failed_over


async def test_lost_response_leads_to_the_same_message_id_in_both_regions(
    emu: Emulator, queue: str, passive: GeoSender
) -> None:
    await passive.send_messages(ServiceBusMessage("warm-up"))
    await drain_ids(emu, "primary", queue)
    await fault(emu, "primary", "drop_dispositions", 1)

    result = await passive.send_messages(ServiceBusMessage("stored but unanswered"))

    assert result.failed_over
    [message_id] = result.message_ids
    assert await drain_ids(emu, "primary", queue) == Counter({message_id: 1})
    assert await drain_ids(emu, "secondary", queue) == Counter({message_id: 1})


async def test_active_keeps_twins_and_survives_one_region(emu: Emulator, queue: str) -> None:
    async with on_emulator(
        GeoSender,
        emu,
        queue,
        mode=ReplicationMode.ACTIVE,
        policy=FailoverPolicy(attempt_timeout=2.0),
    ) as sender:
        both = [await sender.send_messages(ServiceBusMessage(f"b{i}")) for i in range(50)]
        await fault(emu, "secondary", "outage")
        one = [await sender.send_messages(ServiceBusMessage(f"o{i}")) for i in range(50)]

        assert all(set(r.accepted) == {"primary", "secondary"} for r in both)
        assert all(r.accepted == ("primary",) and "secondary" in r.failed for r in one)

        await fault(emu, "primary", "outage")
        with pytest.raises(AllRegionsUnavailableError) as raised:
            await sender.send_messages(ServiceBusMessage("nowhere"))
        assert set(raised.value.causes) == {"primary", "secondary"}

    await fault_all(emu, "restore")
    in_primary = await drain_ids(emu, "primary", queue)
    in_secondary = await drain_ids(emu, "secondary", queue)
    both_ids = {r.message_ids[0] for r in both}
    assert set(in_primary) == both_ids | {r.message_ids[0] for r in one}
    assert set(in_secondary) == both_ids, "twins carry the same MessageId"


async def test_active_outbox_queues_while_both_are_down_then_delivers(
    emu: Emulator, queue: str, tmp_path: Path
) -> None:
    async with (
        SqliteOutbox(tmp_path / "outbox.db") as outbox,
        on_emulator(
            GeoSender,
            emu,
            queue,
            mode="active",
            outbox=outbox,
            policy=FailoverPolicy(attempt_timeout=2.0),
            drain=DrainPolicy(max_backoff=1.0),
        ) as sender,
    ):
        await fault_all(emu, "outage")
        results = [await sender.send_messages(ServiceBusMessage(f"q{i}")) for i in range(20)]
        assert all(r.queued for r in results)
        assert await outbox.depth() == 40, "one entry per region per message"

        await fault_all(emu, "restore")
        assert await outbox_emptied(outbox), "the drainer did not empty the outbox in 30 s"

    ids = {r.message_ids[0] for r in results}
    assert set(await drain_ids(emu, "primary", queue)) == ids
    assert set(await drain_ids(emu, "secondary", queue)) == ids


async def test_bad_input_is_raised_at_once_without_failover_or_outbox(
    emu: Emulator, queue: str, tmp_path: Path
) -> None:
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    async with (
        SqliteOutbox(tmp_path / "outbox.db") as outbox,
        GeoSender.from_connection_strings(
            primary, secondary, queue_name=queue, outbox=outbox
        ) as sender,
    ):
        # Certainly over the limit the regions announced: refused before any call (issue 20).
        with pytest.raises(InvalidMessageError, match="limit of 262144"):
            await sender.send_messages(ServiceBusMessage(b"x" * 300_000))
        # Over it only once encoded: the region refuses it, raised as it is.
        with pytest.raises(MessageTooLargeError, match="primary"):
            await sender.send_messages(ServiceBusMessage(b"x" * 262_100))
        assert sender.active_region == "primary"
        assert await outbox.depth() == 0

    key = dict(p.split("=", 1) for p in primary.split(";") if p)["SharedAccessKey"]
    wrong = primary.replace(key, base64.b64encode(b"wrong key").decode())
    async with (
        SqliteOutbox(tmp_path / "outbox.db") as outbox,
        GeoSender.from_connection_strings(wrong, secondary, queue_name=queue, outbox=outbox) as s,
    ):
        with pytest.raises(AuthenticationError) as raised:
            await s.send_messages(ServiceBusMessage("m"))
        assert key not in str(raised.value) and "wrong" not in str(raised.value)
        assert s.active_region == "primary"

    async with (
        SqliteOutbox(tmp_path / "outbox.db") as outbox,
        GeoSender.from_connection_strings(
            primary, secondary, queue_name="no-such-queue", outbox=outbox
        ) as s,
    ):
        with pytest.raises(EntityNotFoundError, match=r"no-such-queue|not found|create"):
            await s.send_messages(ServiceBusMessage("m"))
        assert await outbox.depth() == 0

    assert emu.namespace("secondary").message_count(queue) == 0


_CRASHING_SENDER = """
import asyncio, os, sys
from azure.servicebus import ServiceBusMessage
from georep import DrainPolicy, GeoSender, FailoverPolicy, SqliteOutbox

async def main():
    async with SqliteOutbox(os.environ["OUTBOX"]) as outbox:
        sender = GeoSender.from_connection_strings(
            os.environ["PRIMARY"], os.environ["SECONDARY"], queue_name=os.environ["QUEUE"],
            outbox=outbox, policy=FailoverPolicy(attempt_timeout=2.0),
            # Entries its drainer holds when it is killed wait for their lease to run out
            # (max(lease, 2 x send budget) = 10 s here) before another drainer takes them.
            drain=DrainPolicy(max_backoff=1.0, lease=5.0),
        )
        for index in range(1_000_000):
            result = await sender.send_messages(ServiceBusMessage(f"c{index}"))
            assert result.queued
            print(result.message_ids[0], flush=True)

asyncio.run(main())
"""


async def test_queued_messages_survive_a_sigkilled_process(
    emu: Emulator, queue: str, tmp_path: Path
) -> None:
    await fault_all(emu, "outage")
    outbox_path = tmp_path / "outbox.db"
    child = await start_child(_CRASHING_SENDER, emu, queue, OUTBOX=str(outbox_path))
    acknowledged: list[str] = []
    try:
        assert child.stdout is not None and child.stderr is not None
        while len(acknowledged) < 25:
            line = await asyncio.wait_for(child.stdout.readline(), 30)
            if not line:
                stderr = (await child.stderr.read()).decode()
                pytest.fail(f"the sender process died early: {stderr[-2000:]}")
            acknowledged.append(line.decode().strip())
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()

    await fault_all(emu, "restore")
    async with (
        SqliteOutbox(outbox_path) as outbox,
        on_emulator(
            GeoSender, emu, queue, outbox=outbox, drain=DrainPolicy(max_backoff=1.0)
        ) as sender,
    ):
        assert await outbox_emptied(outbox), "the drainer did not empty the outbox in 30 s"
        assert sender.stats.drained >= len(acknowledged)

    delivered = await drain_all_ids(emu, queue)
    assert set(acknowledged) <= set(delivered), "every acknowledged message was delivered"


async def test_a_malformed_connection_string_never_shows_the_key() -> None:
    secret = "c2VjcmV0LWtleS12YWx1ZQ=="
    from georep import ConfigurationError

    with pytest.raises(ConfigurationError) as raised:
        GeoSender.from_connection_strings(
            f"SharedAccessKeyName=root;SharedAccessKey={secret}",
            f"Endpoint=sb://x/;SharedAccessKeyName=root;SharedAccessKey={secret}",
            queue_name="q",
        )
    assert "Endpoint" in str(raised.value) and secret not in str(raised.value)
    assert json.dumps(str(raised.value))  # a plain, printable message
