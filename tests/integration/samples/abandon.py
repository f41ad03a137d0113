"""Abandon a message and get it again: the SDK's
sample_code_servicebus.py abandon_message."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            await sender.send_messages(ServiceBusMessage("try me twice"))
        async with client.get_queue_receiver(names.queue) as receiver:
            (first,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
            print("first", str(first), first.delivery_count)
            await receiver.abandon_message(first)
            await checkpoint()
            (again,) = await receiver.receive_messages(max_message_count=1, max_wait_time=10)
            print("again", str(again))
            await receiver.complete_message(again)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            sender.send_messages(ServiceBusMessage("try me twice"))
        with client.get_queue_receiver(names.queue) as receiver:
            (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            print("first", str(first), first.delivery_count)
            receiver.abandon_message(first)
            checkpoint()
            (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
            print("again", str(again))
            receiver.complete_message(again)
