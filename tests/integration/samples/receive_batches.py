"""Receive in batches with ``receive_messages(max_message_count=..., max_wait_time=...)``
and read the message properties user code reads: the SDK's receive_queue.py and
sample_code_servicebus.py (receive_complex_message)."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage


def _message(index: int) -> ServiceBusMessage:
    return ServiceBusMessage(
        f"order {index}",
        message_id=f"order-{index}",
        subject="orders",
        content_type="text/plain",
        correlation_id=f"customer-{index % 3}",
        application_properties={"priority": index % 2, "region": "eu"},
    )


def _describe(msg: Any) -> str:
    properties = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in (msg.application_properties or {}).items()
    }
    return (
        f"{msg} id={msg.message_id} subject={msg.subject} type={msg.content_type} "
        f"correlation={msg.correlation_id} props={sorted(properties.items())} "
        f"delivery_count={msg.delivery_count} locked={msg.locked_until_utc is not None} "
        f"has_sequence_number={msg.sequence_number is not None}"
    )


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            await sender.send_messages([_message(i) for i in range(10)])
        seen = []
        async with client.get_queue_receiver(names.queue) as receiver:
            while len(seen) < 10:
                batch = await receiver.receive_messages(max_message_count=4, max_wait_time=5)
                if not batch:
                    break
                for msg in batch:
                    seen.append(_describe(msg))
                    await receiver.complete_message(msg)
                await checkpoint()
        for line in sorted(seen):
            print(line)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            sender.send_messages([_message(i) for i in range(10)])
        seen = []
        with client.get_queue_receiver(names.queue) as receiver:
            while len(seen) < 10:
                batch = receiver.receive_messages(max_message_count=4, max_wait_time=5)
                if not batch:
                    break
                for msg in batch:
                    seen.append(_describe(msg))
                    receiver.complete_message(msg)
                checkpoint()
        for line in sorted(seen):
            print(line)
