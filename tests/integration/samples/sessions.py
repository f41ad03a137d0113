"""Send to a session-enabled queue, receive one named session in order with its state,
then the next available one: the SDK's session_send_receive.py and session_state samples."""

from __future__ import annotations

from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage


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
        receiver = client.get_queue_receiver(
            names.session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        )
        async with receiver:
            # One receive_messages call may return fewer than are there (the SDK's too):
            # receive until a call comes back empty.
            msgs = []
            while batch := await receiver.receive_messages(max_message_count=10, max_wait_time=3):
                for msg in batch:
                    await receiver.complete_message(msg)
                msgs += batch
            print(receiver.session.session_id, [str(m) for m in msgs])
            print("state", await receiver.session.get_state())


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
        receiver = client.get_queue_receiver(
            names.session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        )
        with receiver:
            # One receive_messages call may return fewer than are there (the SDK's too):
            # receive until a call comes back empty.
            msgs = []
            while batch := receiver.receive_messages(max_message_count=10, max_wait_time=3):
                for msg in batch:
                    receiver.complete_message(msg)
                msgs += batch
            print(receiver.session.session_id, [str(m) for m in msgs])
            print("state", receiver.session.get_state())
