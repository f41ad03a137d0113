"""Send to a queue (one message, a list, a batch) and receive by iterating the receiver: the
SDK's send_queue.py and receive_queue.py samples."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        sender = client.get_queue_sender(queue_name=names.queue)
        async with sender:
            await sender.send_messages(ServiceBusMessage("Single Message"))
            await sender.send_messages(
                [ServiceBusMessage(f"Message in list {i}") for i in range(3)]
            )
            batch = await sender.create_message_batch()
            for i in range(3):
                batch.add_message(ServiceBusMessage(f"Message inside a batch {i}"))
            await sender.send_messages(batch)
        received = []
        receiver = client.get_queue_receiver(queue_name=names.queue, max_wait_time=3)
        async with receiver:
            async for msg in receiver:
                received.append(str(msg))
                await receiver.complete_message(msg)
                if len(received) == 3:
                    await checkpoint()
        for body in sorted(received):
            print(body)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        sender = client.get_queue_sender(queue_name=names.queue)
        with sender:
            sender.send_messages(ServiceBusMessage("Single Message"))
            sender.send_messages([ServiceBusMessage(f"Message in list {i}") for i in range(3)])
            batch = sender.create_message_batch()
            for i in range(3):
                batch.add_message(ServiceBusMessage(f"Message inside a batch {i}"))
            sender.send_messages(batch)
        received = []
        receiver = client.get_queue_receiver(queue_name=names.queue, max_wait_time=3)
        with receiver:
            for msg in receiver:
                received.append(str(msg))
                receiver.complete_message(msg)
                if len(received) == 3:
                    checkpoint()
        for body in sorted(received):
            print(body)
