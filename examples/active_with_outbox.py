"""Active replication with a durable outbox: nothing acknowledged is lost while both are down.

Runnable: ``python examples/active_with_outbox.py`` (starts its own two-region emulator and
keeps the outbox in a temporary directory).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path

from azure.servicebus import ServiceBusMessage

from georep import (
    DrainPolicy,
    FailoverPolicy,
    GeoSender,
    ReplicationMode,
    SendResult,
    SqliteOutbox,
)
from georep.adapters.emulator import Emulator

QUEUE = "orders"
REGIONS = ("primary", "secondary")


async def fault(emu: Emulator, action: str, *regions: str) -> None:
    # Control calls block; keep them off the event loop the SDK runs on.
    for region in regions:
        await asyncio.to_thread(getattr(emu.namespace(region), action))


async def wait_until_empty(outbox: SqliteOutbox, within: float) -> bool:
    """Wait for the GeoSender's background drainer to empty the outbox."""
    deadline = time.monotonic() + within
    while await outbox.depth():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def main() -> None:
    logging.basicConfig(format="  log %(levelname)s %(name)s: %(message)s")
    # The drainer's "regions still unavailable; backing off" warnings are expected here.
    logging.getLogger("georep.sender").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as directory:
        async with Emulator(namespaces=REGIONS, queues=(QUEUE,)) as emu:
            message_ids = await send_through_outages(emu, Path(directory) / "outbox.db")
            stored = {
                region: await asyncio.to_thread(emu.namespace(region).message_count, QUEUE)
                for region in REGIONS
            }
    print(f"stored per region: {stored} for {len(message_ids)} messages")
    if any(count != len(message_ids) for count in stored.values()):
        raise SystemExit("a region is missing a copy")
    print("both regions hold every message")


async def send_through_outages(emu: Emulator, outbox_path: Path) -> set[str]:
    """Send while one, then both regions are down; return the MessageIds acknowledged."""
    async with (
        # The outbox belongs to the application: GeoSender never closes it.
        SqliteOutbox(outbox_path) as outbox,
        GeoSender.from_connection_strings(
            emu.connection_string("primary"),
            emu.connection_string("secondary"),
            queue_name=QUEUE,
            mode=ReplicationMode.ACTIVE,
            outbox=outbox,
            # A region that missed a copy gets it later through the outbox.
            repair=True,
            policy=FailoverPolicy(attempt_timeout=3.0),
            # Short backoff so the example drains within a second or two of the restore.
            drain=DrainPolicy(max_backoff=1.0),
        ) as sender,
    ):
        results: list[SendResult] = []

        async def send(label: str, count: int) -> list[SendResult]:
            sent = [
                await sender.send_messages(ServiceBusMessage(f"{label} {index}"))
                for index in range(count)
            ]
            results.extend(sent)
            return sent

        both_up = await send("both up", 3)
        print(f"both regions up: {len(both_up)} sent, each accepted by {both_up[0].accepted}")

        await fault(emu, "outage", "secondary")
        one_down = await send("secondary down", 3)
        repaired = sum(1 for r in one_down if r.repair_queued)
        print(
            f"secondary down: {len(one_down)} accepted by primary, "
            f"{repaired} secondary copies queued for repair"
        )

        await fault(emu, "outage", "primary")
        all_down = await send("both down", 5)
        queued = sum(1 for r in all_down if r.queued)
        print(f"both regions down: {queued} of {len(all_down)} queued in the outbox")
        print(f"outbox entries (one per copy a region still owes): {await outbox.depth()}")

        await fault(emu, "restore", *REGIONS)
        print("both regions restored; the background drainer resends the outbox")
        if not await wait_until_empty(outbox, within=15.0):
            raise SystemExit(f"the outbox still holds {await outbox.depth()} entries")
        print(f"drained: {sender.stats.drained}, outbox entries left: {await outbox.depth()}")
    return {message_id for result in results for message_id in result.message_ids}


if __name__ == "__main__":
    asyncio.run(main())
