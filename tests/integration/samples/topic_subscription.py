"""Send to a topic and receive from its subscription: the SDK's send_topic.py and
receive_subscription.py samples."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusMessage


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        sender = client.get_topic_sender(topic_name=names.topic)
        async with sender:
            await sender.send_messages([ServiceBusMessage(f"topic message {i}") for i in range(5)])
        await checkpoint()
        received = []
        receiver = client.get_subscription_receiver(
            topic_name=names.topic, subscription_name=names.subscription
        )
        async with receiver:
            while len(received) < 5:
                msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=5)
                if not msgs:
                    break
                for msg in msgs:
                    received.append(str(msg))
                    await receiver.complete_message(msg)
        print(sorted(received))


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        sender = client.get_topic_sender(topic_name=names.topic)
        with sender:
            sender.send_messages([ServiceBusMessage(f"topic message {i}") for i in range(5)])
        checkpoint()
        received = []
        receiver = client.get_subscription_receiver(
            topic_name=names.topic, subscription_name=names.subscription
        )
        with receiver:
            while len(received) < 5:
                msgs = receiver.receive_messages(max_message_count=10, max_wait_time=5)
                if not msgs:
                    break
                for msg in msgs:
                    received.append(str(msg))
                    receiver.complete_message(msg)
        print(sorted(received))
