"""Browse a queue with ``peek_messages`` (paging: each call continues where the last one
ended), then receive everything: the SDK's receive_peek.py sample."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            for i in range(4):
                await sender.send_messages(ServiceBusMessage(f"peeked {i}"))
        async with client.get_queue_receiver(names.queue, max_wait_time=3) as receiver:
            first = await receiver.peek_messages(max_message_count=2)
            print("first page", [str(m) for m in first])
            await checkpoint()
            second = await receiver.peek_messages(max_message_count=2)
            print("second page", [str(m) for m in second])
            again = await receiver.peek_messages(max_message_count=10, sequence_number=1)
            print("from the start", sorted(str(m) for m in again))
            received = []
            async for msg in receiver:
                received.append(str(msg))
                await receiver.complete_message(msg)
            print("received", sorted(received))
            print("left", await receiver.peek_messages(10, sequence_number=1))


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            for i in range(4):
                sender.send_messages(ServiceBusMessage(f"peeked {i}"))
        with client.get_queue_receiver(names.queue, max_wait_time=3) as receiver:
            first = receiver.peek_messages(max_message_count=2)
            print("first page", [str(m) for m in first])
            checkpoint()
            second = receiver.peek_messages(max_message_count=2)
            print("second page", [str(m) for m in second])
            again = receiver.peek_messages(max_message_count=10, sequence_number=1)
            print("from the start", sorted(str(m) for m in again))
            received = []
            for msg in receiver:
                received.append(str(msg))
                receiver.complete_message(msg)
            print("received", sorted(received))
            print("left", receiver.peek_messages(10, sequence_number=1))
