"""The azure-servicebus message codec: copies and outbox encodings keep every field."""

from __future__ import annotations

import inspect
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageHeader, AmqpMessageProperties

from georep import InvalidMessageError, OversizeMessageError
from georep.adapters.servicebus import GeoMessageBatch, ServiceBusCodec

# Every field ServiceBusMessage takes a keyword for (read from the SDK, so a field it adds
# is checked too), but the body and the application properties, which same() compares.
FIELDS = tuple(
    name
    for name, parameter in inspect.signature(ServiceBusMessage).parameters.items()
    if parameter.kind is parameter.KEYWORD_ONLY and name != "application_properties"
)


def full_message() -> ServiceBusMessage:
    return ServiceBusMessage(
        b"\x00body\xff",
        message_id="m-1",
        session_id="s-1",
        partition_key="s-1",
        content_type="application/json",
        correlation_id="c-1",
        subject="orders",
        to="somewhere",
        reply_to="replies",
        reply_to_session_id="rs-1",
        time_to_live=timedelta(seconds=90),
        scheduled_enqueue_time_utc=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        application_properties={
            "text": "v",
            "number": 7,
            "ratio": 0.5,
            "flag": True,
            "raw": b"\x01\x02",
            "id": uuid.UUID(int=5),
        },
    )


def test_the_fields_compared_are_the_sdk_message_fields() -> None:
    assert len(FIELDS) == 11 and {"message_id", "scheduled_enqueue_time_utc"} <= set(FIELDS)


def same(a: ServiceBusMessage, b: ServiceBusMessage) -> None:
    assert b"".join(a.body) == b"".join(b.body)
    for name in FIELDS:
        assert getattr(a, name) == getattr(b, name), name
    assert a.application_properties == b.application_properties


@pytest.mark.parametrize("make", [full_message, lambda: ServiceBusMessage("plain")])
def test_copy_keeps_every_field_and_is_independent(make: object) -> None:
    codec = ServiceBusCodec()
    original = make()  # type: ignore[operator]
    copy = codec.copy(original)
    assert copy is not original
    same(original, copy)
    codec.set_application_property(copy, "extra", "x")
    assert codec.application_property(original, "extra") is None


@pytest.mark.parametrize("make", [full_message, lambda: ServiceBusMessage("plain")])
def test_encode_decode_round_trip(make: object) -> None:
    codec = ServiceBusCodec()
    original = make()  # type: ignore[operator]
    same(original, codec.decode(codec.encode(original)))


def test_message_id_is_read_and_set() -> None:
    codec = ServiceBusCodec()
    message = ServiceBusMessage("x", message_id=None)
    message.message_id = None  # azure-servicebus 7.15 assigns one by default
    assert codec.message_id(message) is None
    codec.set_message_id(message, "abc")
    assert message.message_id == "abc" and codec.message_id(message) == "abc"


def test_unsupported_inputs_name_the_fix() -> None:
    codec = ServiceBusCodec()
    with pytest.raises(InvalidMessageError, match="ServiceBusMessage"):
        codec.split(42)
    with pytest.raises(InvalidMessageError, match="cannot be stored"):
        codec.encode(ServiceBusMessage("x", application_properties={"bad": object()}))  # type: ignore[dict-item]


def test_geo_batch_prepares_each_message_as_it_is_added() -> None:
    prepared: list[ServiceBusMessage] = []
    batch = ServiceBusCodec().new_batch(10_000, prepared.append)
    assert isinstance(batch, GeoMessageBatch)
    batch.add_message(ServiceBusMessage("a"))
    batch.add_message({"body": "b"})
    assert len(batch) == 2 and len(prepared) == 2
    assert ServiceBusCodec().split(batch) == prepared


def _id_giver() -> Any:
    """A ``prepare`` as the sender's: gives a message without a MessageId one; returns it."""

    def prepare(message: ServiceBusMessage) -> str:
        message.message_id = message.message_id or f"id-{uuid.uuid4().hex[:6]}"
        return str(message.message_id)

    return prepare


def test_a_geo_batch_hands_back_the_ids_it_gave_without_checking_again() -> None:
    codec = ServiceBusCodec()
    batch = codec.new_batch(10_000, _id_giver())
    batch.add_message(ServiceBusMessage("a", message_id="kept"))
    batch.add_message(ServiceBusMessage("b"))

    ids = codec.prepared_ids(batch, one_partition=False, max_size=1_000_000)

    assert ids == tuple(str(m.message_id) for m in codec.split(batch)) and ids[0] == "kept"


def test_anything_but_a_geo_batch_is_checked_message_by_message() -> None:
    codec = ServiceBusCodec()
    message = ServiceBusMessage("a")

    assert codec.prepared_ids(message, one_partition=False) is None
    assert codec.prepared_ids([message], one_partition=False) is None


def test_a_geo_batch_over_the_limit_is_left_to_the_full_check_which_explains_it() -> None:
    codec = ServiceBusCodec()
    batch = codec.new_batch(10_000, _id_giver())
    batch.add_message(ServiceBusMessage(b"x" * 3_000))

    assert codec.prepared_ids(batch, one_partition=False, max_size=1_000) is None
    with pytest.raises(OversizeMessageError, match="1000 bytes"):
        codec.check(codec.split(batch), one_partition=False, max_size=1_000)


def test_a_geo_batch_mixing_partition_keys_is_refused_for_a_partitioned_entity() -> None:
    codec = ServiceBusCodec()
    batch = codec.new_batch(10_000, _id_giver())
    batch.add_message(ServiceBusMessage("a", partition_key="k1"))
    batch.add_message(ServiceBusMessage("b", session_id="k2"))

    assert codec.prepared_ids(batch, one_partition=False) is not None
    with pytest.raises(InvalidMessageError, match=r"one partition key.*mixes 2"):
        codec.prepared_ids(batch, one_partition=True)


def test_a_message_whose_session_and_partition_key_differ_is_refused_as_it_is_added() -> None:
    codec = ServiceBusCodec()
    batch = codec.new_batch(10_000, _id_giver())
    message = ServiceBusMessage("m", partition_key="p")
    message.session_id = "s"  # the SDK checks only when partition_key is set last

    with pytest.raises(InvalidMessageError, match="session_id 's' and a different partition_key"):
        batch.add_message(message)
    assert len(batch) == 0 and codec.prepared_ids(batch, one_partition=True) == ()


def amqp_messages() -> list[AmqpAnnotatedMessage]:
    """The three bodies of the SDK's send_and_receive_amqp_annotated_message sample, with
    every section set."""
    sections: dict[str, Any] = {
        "header": AmqpMessageHeader(priority=3, durable=True, time_to_live=60_000),
        "footer": {"footer_key": "footer_value"},
        "properties": AmqpMessageProperties(message_id="a-1", subject="s", group_id="g"),
        "application_properties": {"body_type": "value", "n": 7},
        "annotations": {"ann_key": "ann_value"},
        "delivery_annotations": {"delivery_annotation_key": "value"},
    }
    return [
        AmqpAnnotatedMessage(data_body=[b"aa", b"bb"], **sections),
        AmqpAnnotatedMessage(value_body={b"key": [-123, b"data", False]}, **sections),
        AmqpAnnotatedMessage(sequence_body=[b"message", 123.456, True], **sections),
    ]


def test_amqp_annotated_messages_are_sent_as_the_sdk_sends_them() -> None:
    codec = ServiceBusCodec()
    messages = amqp_messages()
    split = codec.split(messages)
    assert [m.raw_amqp_message for m in split] == messages, "the very objects, not copies"
    codec.set_message_id(split[0], "new-id")
    assert messages[0].properties.message_id == "new-id"
    codec.check(split, one_partition=False)
    [one] = codec.split(messages[1])
    assert one.raw_amqp_message is messages[1]
    batch = codec.new_batch(100_000, lambda message: None)
    batch.add_message(messages[2])
    assert len(codec.split(batch)) == 1


@pytest.mark.parametrize("index", [0, 1, 2], ids=["data", "value", "sequence"])
def test_an_amqp_message_copy_keeps_every_section(index: int) -> None:
    codec = ServiceBusCodec()
    [original] = codec.split(amqp_messages()[index])
    copy = codec.copy(original).raw_amqp_message
    raw = original.raw_amqp_message
    assert copy is not raw
    assert copy.body_type == raw.body_type and list(copy.body) == list(raw.body)
    assert copy.header.priority == 3 and copy.footer == raw.footer
    assert copy.annotations == raw.annotations
    assert copy.delivery_annotations == raw.delivery_annotations
    assert copy.properties.message_id == "a-1"
    assert copy.application_properties == raw.application_properties


@pytest.mark.parametrize("index", [1, 2], ids=["value", "sequence"])
def test_an_amqp_value_or_sequence_body_round_trips_through_the_outbox(index: int) -> None:
    codec = ServiceBusCodec()
    [original] = codec.split(amqp_messages()[index])
    decoded = codec.decode(codec.encode(original))
    assert decoded.body_type == original.body_type
    assert list(decoded.raw_amqp_message.body) == list(original.raw_amqp_message.body)
    assert decoded.message_id == "a-1" and decoded.session_id == "g"
    assert decoded.application_properties == original.application_properties
    assert decoded.time_to_live == original.time_to_live
