"""Schedule two messages, cancel one, receive the other when it is due: the SDK's
schedule_messages_and_cancellation.py sample."""

from __future__ import annotations

import datetime
from typing import Any

from azure.servicebus import ServiceBusMessage


def _due() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            kept = await sender.schedule_messages(ServiceBusMessage("scheduled, kept"), _due())
            dropped = await sender.schedule_messages(
                [ServiceBusMessage("scheduled, cancelled")], _due()
            )
            print("scheduled", len(kept) + len(dropped))
            await sender.cancel_scheduled_messages(dropped)
        await checkpoint()
        async with client.get_queue_receiver(names.queue) as receiver:
            msgs = await receiver.receive_messages(max_message_count=5, max_wait_time=20)
            for msg in msgs:
                print("received", str(msg))
                await receiver.complete_message(msg)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            kept = sender.schedule_messages(ServiceBusMessage("scheduled, kept"), _due())
            dropped = sender.schedule_messages([ServiceBusMessage("scheduled, cancelled")], _due())
            print("scheduled", len(kept) + len(dropped))
            sender.cancel_scheduled_messages(dropped)
        checkpoint()
        with client.get_queue_receiver(names.queue) as receiver:
            msgs = receiver.receive_messages(max_message_count=5, max_wait_time=20)
            for msg in msgs:
                print("received", str(msg))
                receiver.complete_message(msg)
