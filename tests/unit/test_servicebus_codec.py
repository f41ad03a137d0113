"""The azure-servicebus message codec: copies and outbox encodings keep every field."""

from __future__ import annotations

import inspect
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage

from georep import InvalidMessageError
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
