"""Send to a session-enabled queue, receive one named session in order with its state,
then the next available one, one message at a time, abandoning one (it comes back before
the next: a session is received in order) while an ``AutoLockRenewer`` keeps the session's
lock: the SDK's session_send_receive.py, session_state and auto_lock_renew samples."""

from __future__ import annotations

from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, AutoLockRenewer, ServiceBusMessage
from azure.servicebus.aio import AutoLockRenewer as AsyncAutoLockRenewer


def _messages(session_id: str) -> list[ServiceBusMessage]:
    return [ServiceBusMessage(f"{session_id} step {i}", session_id=session_id) for i in range(4)]


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(names.session_queue) as sender:
            await sender.send_messages(_messages("cart-1"))
            await sender.send_messages(_messages("cart-2"))
        receiver = client.get_queue_receiver(
            names.session_queue, session_id="cart-1", max_wait_time=3
        )
        async with receiver:
            session = receiver.session
            await session.set_state("checking out")
            received = []
            async for msg in receiver:
                received.append(str(msg))
                await receiver.complete_message(msg)
                if len(received) == 2:
                    await checkpoint()
            await session.renew_lock()
            print(session.session_id, received, await session.get_state())
        renewer = AsyncAutoLockRenewer(max_lock_renewal_duration=60)
        receiver = client.get_queue_receiver(
            names.session_queue,
            session_id=NEXT_AVAILABLE_SESSION,
            max_wait_time=5,
            auto_lock_renewer=renewer,
        )
        async with renewer, receiver:
            msgs: list[str] = []
            while batch := await receiver.receive_messages(max_message_count=1, max_wait_time=3):
                (msg,) = batch
                if str(msg).endswith("step 1") and not any(m.startswith("abandoned") for m in msgs):
                    await receiver.abandon_message(msg)
                    msgs.append(f"abandoned {msg}")
                    continue
                await receiver.complete_message(msg)
                msgs.append(str(msg))
            print(receiver.session.session_id, msgs)
            print("state", await receiver.session.get_state())
            print("renewal failed:", receiver.session.auto_renew_error)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(names.session_queue) as sender:
            sender.send_messages(_messages("cart-1"))
            sender.send_messages(_messages("cart-2"))
        receiver = client.get_queue_receiver(
            names.session_queue, session_id="cart-1", max_wait_time=3
        )
        with receiver:
            session = receiver.session
            session.set_state("checking out")
            received = []
            for msg in receiver:
                received.append(str(msg))
                receiver.complete_message(msg)
                if len(received) == 2:
                    checkpoint()
            session.renew_lock()
            print(session.session_id, received, session.get_state())
        renewer = AutoLockRenewer(max_lock_renewal_duration=60)
        receiver = client.get_queue_receiver(
            names.session_queue,
            session_id=NEXT_AVAILABLE_SESSION,
            max_wait_time=5,
            auto_lock_renewer=renewer,
        )
        with renewer, receiver:
            msgs: list[str] = []
            while batch := receiver.receive_messages(max_message_count=1, max_wait_time=3):
                (msg,) = batch
                if str(msg).endswith("step 1") and not any(m.startswith("abandoned") for m in msgs):
                    receiver.abandon_message(msg)
                    msgs.append(f"abandoned {msg}")
                    continue
                receiver.complete_message(msg)
                msgs.append(str(msg))
            print(receiver.session.session_id, msgs)
            print("state", receiver.session.get_state())
            print("renewal failed:", receiver.session.auto_renew_error)
