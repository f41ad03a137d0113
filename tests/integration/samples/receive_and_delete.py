"""Receive in RECEIVE_AND_DELETE mode (no settling): the SDK's receive modes sample."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.queue) as sender:
            await sender.send_messages(
                [ServiceBusMessage(f"fire and forget {i}") for i in range(6)]
            )
        received = []
        receiver = client.get_queue_receiver(
            names.queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
        async with receiver:
            while len(received) < 6:
                msgs = await receiver.receive_messages(max_message_count=3, max_wait_time=5)
                if not msgs:
                    break
                received.extend(str(m) for m in msgs)
                await checkpoint()
        print(sorted(received))


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.queue) as sender:
            sender.send_messages([ServiceBusMessage(f"fire and forget {i}") for i in range(6)])
        received = []
        receiver = client.get_queue_receiver(
            names.queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
        with receiver:
            while len(received) < 6:
                msgs = receiver.receive_messages(max_message_count=3, max_wait_time=5)
                if not msgs:
                    break
                received.extend(str(m) for m in msgs)
                checkpoint()
        print(sorted(received))
