"""Hold a message longer than its lock with an ``AutoLockRenewer``, then complete it: the
SDK's auto_lock_renew.py sample (``lock_queue`` has a 5 s lock)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from azure.servicebus import AutoLockRenewer, ServiceBusMessage
from azure.servicebus.aio import AutoLockRenewer as AsyncAutoLockRenewer

WORK_SECONDS = 7.0
"""How long the program works on the message: beyond the queue's 5 s lock."""


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    renewer = AsyncAutoLockRenewer(max_lock_renewal_duration=60)
    async with client, renewer:
        async with client.get_queue_sender(names.lock_queue) as sender:
            await sender.send_messages(ServiceBusMessage("long job"))
        async with client.get_queue_receiver(names.lock_queue) as receiver:
            (msg,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
            renewer.register(receiver, msg)
            await asyncio.sleep(WORK_SECONDS)  # the work
            await receiver.complete_message(msg)
            print("completed", str(msg), "after", WORK_SECONDS, "s")
            await checkpoint()
            print("left", await receiver.receive_messages(max_message_count=1, max_wait_time=3))


def run(client: Any, names: Any, checkpoint: Any) -> None:
    renewer = AutoLockRenewer(max_lock_renewal_duration=60)
    with client, renewer:
        with client.get_queue_sender(names.lock_queue) as sender:
            sender.send_messages(ServiceBusMessage("long job"))
        with client.get_queue_receiver(names.lock_queue, auto_lock_renewer=renewer) as receiver:
            (msg,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            time.sleep(WORK_SECONDS)  # the work
            receiver.complete_message(msg)
            print("completed", str(msg), "after", WORK_SECONDS, "s")
            checkpoint()
            print("left", receiver.receive_messages(max_message_count=1, max_wait_time=3))
