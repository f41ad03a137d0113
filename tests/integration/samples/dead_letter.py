"""Dead-letter messages, browse the dead-letter queue, then read them back from there: the
SDK's receive_deadlettered_messages.py sample, with a reason and description longer than a
few hundred characters, and a message dead-lettered without either (None, not empty)."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

LONG_REASON = "cannot parse: " + "x" * 400
LONG_DESCRIPTION = "not JSON; " * 200


def shown(text: str | None) -> object:
    """A reason or description as printed: None, the text, or a long one's length."""
    return text if text is None or len(text) < 40 else f"{len(text)} characters"


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            bodies = ("good", "poison", "fine", "mute")
            await sender.send_messages([ServiceBusMessage(b) for b in bodies])
        async with client.get_queue_receiver(names.queue, max_wait_time=3) as receiver:
            async for msg in receiver:
                if str(msg) == "poison":
                    await receiver.dead_letter_message(
                        msg, reason=LONG_REASON, error_description=LONG_DESCRIPTION
                    )
                elif str(msg) == "mute":
                    await receiver.dead_letter_message(msg)
                else:
                    await receiver.complete_message(msg)
        await checkpoint()
        dlq = client.get_queue_receiver(
            names.queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
        )
        async with dlq:
            peeked = await dlq.peek_messages(max_message_count=10)
            print("peeked:", sorted((str(m), shown(m.dead_letter_reason)) for m in peeked))
            received = []
            for _ in range(5):  # both are there: one call may bring the first alone
                received += await dlq.receive_messages(max_message_count=10, max_wait_time=5)
                if len(received) >= 2:
                    break
            for msg in sorted(received, key=str):
                print(
                    "dead-lettered:",
                    str(msg),
                    shown(msg.dead_letter_reason),
                    shown(msg.dead_letter_error_description),
                    "no properties" if msg.application_properties is None else "properties",
                )
                await dlq.complete_message(msg)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            bodies = ("good", "poison", "fine", "mute")
            sender.send_messages([ServiceBusMessage(b) for b in bodies])
        with client.get_queue_receiver(names.queue, max_wait_time=3) as receiver:
            for msg in receiver:
                if str(msg) == "poison":
                    receiver.dead_letter_message(
                        msg, reason=LONG_REASON, error_description=LONG_DESCRIPTION
                    )
                elif str(msg) == "mute":
                    receiver.dead_letter_message(msg)
                else:
                    receiver.complete_message(msg)
        checkpoint()
        dlq = client.get_queue_receiver(
            names.queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
        )
        with dlq:
            peeked = dlq.peek_messages(max_message_count=10)
            print("peeked:", sorted((str(m), shown(m.dead_letter_reason)) for m in peeked))
            received = []
            for _ in range(5):  # both are there: one call may bring the first alone
                received += dlq.receive_messages(max_message_count=10, max_wait_time=5)
                if len(received) >= 2:
                    break
            for msg in sorted(received, key=str):
                print(
                    "dead-lettered:",
                    str(msg),
                    shown(msg.dead_letter_reason),
                    shown(msg.dead_letter_error_description),
                    "no properties" if msg.application_properties is None else "properties",
                )
                dlq.complete_message(msg)
