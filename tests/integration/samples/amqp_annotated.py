"""Send AMQP annotated messages (data, value and sequence bodies, every section set) to a
queue and a scheduled one, then receive them: the SDK's
send_and_receive_amqp_annotated_message.py sample."""

from __future__ import annotations

import datetime
from typing import Any

from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType


def _messages() -> list[AmqpAnnotatedMessage]:
    sections: dict[str, Any] = {
        "header": {"priority": 5},
        "footer": {"footer_key": "footer_value"},
        "properties": {"subject": "amqp"},
        "application_properties": {"body_type": "set below"},
        "annotations": {"annotation_key": "value"},
        "delivery_annotations": {"delivery_annotation_key": "value"},
    }
    data = AmqpAnnotatedMessage(data_body=[b"aa", b"bb", b"cc"], **sections)
    value = AmqpAnnotatedMessage(value_body={b"key": [-123, b"data", False]}, **sections)
    sequence = AmqpAnnotatedMessage(sequence_body=[b"message", 123.456, True], **sections)
    for message, kind in ((data, "data"), (value, "value"), (sequence, "sequence")):
        message.application_properties = {"body_type": kind}
    return [data, value, sequence]


def _due() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)


def _line(msg: Any) -> str:
    body = msg.body if msg.body_type == AmqpMessageBodyType.VALUE else list(msg.body)
    kind = msg.application_properties[b"body_type"].decode()
    return f"{kind}: {msg.body_type.value} {body!r} subject={msg.subject}"


async def run_async(client: Any, names: Any, checkpoint: Any) -> None:
    async with client:
        async with client.get_queue_sender(queue_name=names.queue) as sender:
            first, *others = _messages()
            await sender.send_messages(first)
            await sender.send_messages(others)
            await sender.schedule_messages(
                AmqpAnnotatedMessage(
                    data_body=b"scheduled", application_properties={"body_type": "scheduled"}
                ),
                _due(),
            )
        lines = []
        receiver = client.get_queue_receiver(queue_name=names.queue)
        async with receiver:
            while len(lines) < 4:
                for msg in await receiver.receive_messages(max_message_count=4, max_wait_time=10):
                    lines.append(_line(msg))
                    await receiver.complete_message(msg)
                    if len(lines) == 1:
                        await checkpoint()
        for line in sorted(lines):
            print(line)


def run(client: Any, names: Any, checkpoint: Any) -> None:
    with client:
        with client.get_queue_sender(queue_name=names.queue) as sender:
            first, *others = _messages()
            sender.send_messages(first)
            sender.send_messages(others)
            sender.schedule_messages(
                AmqpAnnotatedMessage(
                    data_body=b"scheduled", application_properties={"body_type": "scheduled"}
                ),
                _due(),
            )
        lines = []
        receiver = client.get_queue_receiver(queue_name=names.queue)
        with receiver:
            while len(lines) < 4:
                for msg in receiver.receive_messages(max_message_count=4, max_wait_time=10):
                    lines.append(_line(msg))
                    receiver.complete_message(msg)
                    if len(lines) == 1:
                        checkpoint()
        for line in sorted(lines):
            print(line)
