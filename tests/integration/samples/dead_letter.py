"""Dead-letter a message, browse the dead-letter queue, then read it back from there: the
SDK's receive_deadlettered_messages.py sample."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            await sender.send_messages([ServiceBusMessage(b) for b in ("good", "poison", "fine")])
        async with client.get_queue_receiver(names.queue, max_wait_time=3) as receiver:
            async for msg in receiver:
                if str(msg) == "poison":
                    await receiver.dead_letter_message(
                        msg, reason="cannot parse", error_description="not JSON"
                    )
                else:
                    await receiver.complete_message(msg)
        await checkpoint()
        dlq = client.get_queue_receiver(
            names.queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
        )
        async with dlq:
            peeked = await dlq.peek_messages(max_message_count=10)
            print("peeked:", [(str(m), m.dead_letter_reason) for m in peeked])
            for msg in await dlq.receive_messages(max_message_count=10, max_wait_time=5):
                print(
                    "dead-lettered:",
                    str(msg),
                    msg.dead_letter_reason,
                    msg.dead_letter_error_description,
                )
                await dlq.complete_message(msg)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            sender.send_messages([ServiceBusMessage(b) for b in ("good", "poison", "fine")])
        with client.get_queue_receiver(names.queue, max_wait_time=3) as receiver:
            for msg in receiver:
                if str(msg) == "poison":
                    receiver.dead_letter_message(
                        msg, reason="cannot parse", error_description="not JSON"
                    )
                else:
                    receiver.complete_message(msg)
        checkpoint()
        dlq = client.get_queue_receiver(
            names.queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
        )
        with dlq:
            peeked = dlq.peek_messages(max_message_count=10)
            print("peeked:", [(str(m), m.dead_letter_reason) for m in peeked])
            for msg in dlq.receive_messages(max_message_count=10, max_wait_time=5):
                print(
                    "dead-lettered:",
                    str(msg),
                    msg.dead_letter_reason,
                    msg.dead_letter_error_description,
                )
                dlq.complete_message(msg)
