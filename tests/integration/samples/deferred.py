"""Defer messages and get them back by sequence number: the SDK's
receive_deferred_message_queue.py sample."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"later {i}") for i in range(3)])
        async with client.get_queue_receiver(names.queue) as receiver:
            numbers = []
            while len(numbers) < 3:
                msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=5)
                if not msgs:
                    break
                for msg in msgs:
                    numbers.append(msg.sequence_number)
                    await receiver.defer_message(msg)
            print("deferred", len(numbers))
            await checkpoint()
            deferred = await receiver.receive_deferred_messages(sequence_numbers=numbers)
            for msg in sorted(deferred, key=str):
                print("completing deferred", str(msg))
                await receiver.complete_message(msg)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            sender.send_messages([ServiceBusMessage(f"later {i}") for i in range(3)])
        with client.get_queue_receiver(names.queue) as receiver:
            numbers = []
            while len(numbers) < 3:
                msgs = receiver.receive_messages(max_message_count=10, max_wait_time=5)
                if not msgs:
                    break
                for msg in msgs:
                    numbers.append(msg.sequence_number)
                    receiver.defer_message(msg)
            print("deferred", len(numbers))
            checkpoint()
            deferred = receiver.receive_deferred_messages(sequence_numbers=numbers)
            for msg in sorted(deferred, key=str):
                print("completing deferred", str(msg))
                receiver.complete_message(msg)
