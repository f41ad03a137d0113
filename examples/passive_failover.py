"""Passive replication: wrap two SDK senders, lose the primary, keep sending.

Runnable: ``python examples/passive_failover.py`` (starts its own two-region emulator).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from georep import FailoverPolicy, GeoSender, RegionError, SendResult
from georep.adapters.emulator import Emulator

QUEUE = "orders"


def describe(result: SendResult) -> str:
    """One line per send; error kinds only (the full text is in georep's log)."""
    failed = ", ".join(
        f"{region} {error.kind.value if isinstance(error, RegionError) else type(error).__name__}"
        for region, error in result.failed.items()
    )
    text = f"accepted by {', '.join(result.accepted)}"
    if result.failed_over:
        text += f" after failover ({failed} failed)"
    return text


async def main() -> None:
    # georep logs each failover and role swap as a warning; show them with their source.
    logging.basicConfig(format="  log %(levelname)s %(name)s: %(message)s")
    async with Emulator(namespaces=("primary", "secondary"), queues=(QUEUE,)) as emu:
        # The application's own clients. retry_total=1: every SDK retry of a dead region
        # delays the failover, and georep fails over instead of retrying further.
        async with (
            ServiceBusClient.from_connection_string(
                emu.connection_string("primary"), retry_total=1
            ) as primary_client,
            ServiceBusClient.from_connection_string(
                emu.connection_string("secondary"), retry_total=1
            ) as secondary_client,
            primary_client.get_queue_sender(QUEUE) as primary_sender,
            secondary_client.get_queue_sender(QUEUE) as secondary_sender,
            # georep wraps the senders and leaves them open on exit: the application owns them.
            GeoSender(
                primary_sender,
                secondary_sender,
                policy=FailoverPolicy(attempt_timeout=3.0),
            ) as sender,
        ):
            message_ids: list[str] = []
            outcomes: Counter[str] = Counter()

            async def send(body: str) -> None:
                result = await sender.send_messages(ServiceBusMessage(body))
                message_ids.extend(result.message_ids)
                outcomes[describe(result)] += 1

            for index in range(5):
                await send(f"order {index}")
            print(f"before the outage: active region {sender.active_region}")

            # The control call blocks; keep it off the event loop the SDK runs on.
            await asyncio.to_thread(emu.namespace("primary").outage)
            print("primary namespace is down (connections refused, data kept)")

            for index in range(5, 10):
                await send(f"order {index}")

            print("send results:")
            for outcome, count in outcomes.items():
                print(f"  {count} x {outcome}")
            stats = sender.stats
            print(
                f"failovers: {stats.failovers}, role swaps: {stats.role_swaps}, "
                f"accepted per region: {dict(stats.accepted)}"
            )
            print(f"active region: {sender.active_region}")

        # Every acknowledged message is stored in exactly one region (an outage keeps data).
        await asyncio.to_thread(emu.namespace("primary").restore)
        stored = {
            name: await asyncio.to_thread(emu.namespace(name).message_count, QUEUE)
            for name in ("primary", "secondary")
        }
        print(f"stored after restore: {stored}")
        if sum(stored.values()) != len(message_ids):
            raise SystemExit(f"expected {len(message_ids)} stored messages, found {stored}")
        print(f"all {len(message_ids)} acknowledged messages are stored")


if __name__ == "__main__":
    asyncio.run(main())
