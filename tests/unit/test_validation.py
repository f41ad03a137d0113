"""Bad input is refused before any network call with a georep error naming the fix (issue 20)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.amqp import AmqpMessageBodyType

from georep import (
    ConfigurationError,
    DrainPolicy,
    FailoverPolicy,
    GeoReplicationError,
    GeoSender,
    InvalidMessageError,
    PairedNamespaceOptions,
)
from georep.adapters.servicebus._codec import ServiceBusCodec
from georep.testing import FakeMessage, InMemoryOutbox, InMemoryRegionSender

CODEC = ServiceBusCodec()


def with_raw_id(message_id: Any) -> ServiceBusMessage:
    """A message whose id was set past the SDK's setter (as a received copy can be)."""
    message = ServiceBusMessage(b"x", message_id="placeholder")
    message.raw_amqp_message.properties.message_id = message_id  # type: ignore[union-attr]
    return message


def check(messages: Any, max_size: int | None = None) -> None:
    CODEC.check(CODEC.split(messages), one_partition=False, max_size=max_size)


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"body": b"x", "bdy": 1}, "unknown field(s) bdy"),
        ({"message_id": "m"}, "needs a 'body'"),
        ({"body": b"x", "message_id": b"\xff\xfe"}, "message_id must be a str, got bytes"),
        ({"body": b"x", "message_id": "m" * 129}, "longer than 128"),
        (with_raw_id("m" * 129), "at most 128"),
        (ServiceBusMessage(b"x", message_id="bad-\udcff"), "not valid Unicode"),
        (ServiceBusMessage(b"x", session_id=b"s"), "session_id must be a str"),  # type: ignore[arg-type]
        (
            ServiceBusMessage(b"x", application_properties={"k": [1, 2]}),  # type: ignore[dict-item]
            "application property 'k' is a list",
        ),
        (ServiceBusMessage(b"x", application_properties={"k": 2**64}), "64-bit"),
        (ServiceBusMessage(b"x", application_properties={1: "v"}), "keys must be str"),  # type: ignore[dict-item]
        ([ServiceBusMessage(b"x"), {"body": b"y", "sesion_id": "s"}], "sesion_id"),
    ],
)
def test_bad_messages_raise_invalid_message_error(message: Any, words: str) -> None:
    with pytest.raises(InvalidMessageError) as raised:
        check(message)
    assert words in str(raised.value)


def test_a_value_body_the_outbox_could_not_keep_is_refused_when_sent() -> None:
    message = ServiceBusMessage(b"x")
    message.raw_amqp_message._body_type = AmqpMessageBodyType.VALUE
    message.raw_amqp_message._value_body = {"a": object()}
    with pytest.raises(InvalidMessageError, match="cannot be stored"):
        check(message)


def test_good_messages_pass_and_keep_their_fields() -> None:
    properties = {
        "s": "v",
        b"b": b"v",
        "i": -(2**63),
        "f": 1.5,
        "t": True,
        "u": uuid.uuid4(),
        "n": None,
    }
    message = ServiceBusMessage("text", message_id="m" * 128, application_properties=properties)
    as_dict = {"body": b"y", "subject": "s", "time_to_live": None}
    messages = CODEC.split([message, as_dict])
    CODEC.check(messages, one_partition=False)
    assert messages[0] is message, "checked as given, not copied"
    assert message.message_id == "m" * 128
    assert message.application_properties == properties
    assert str(message) == "text"
    assert (messages[1].subject, b"".join(messages[1].body)) == ("s", b"y")


def test_a_body_over_the_known_limit_is_refused_before_sending() -> None:
    check(ServiceBusMessage(b"x" * 1000), max_size=1000)
    with pytest.raises(InvalidMessageError, match="over the entity's limit of 1000"):
        check(ServiceBusMessage(b"x" * 1001), max_size=1000)
    with pytest.raises(InvalidMessageError, match="2 messages together have 1200 bytes"):
        check([ServiceBusMessage(b"x" * 600), ServiceBusMessage(b"x" * 600)], max_size=1000)


def test_one_oversized_message_is_named_with_the_limit_and_not_told_to_split() -> None:
    with pytest.raises(InvalidMessageError) as raised:
        check(ServiceBusMessage(b"x" * 2048, message_id="order-7"), max_size=1024)
    text = str(raised.value)
    assert text.startswith("message 'order-7' has 2048 bytes of body, over the entity's limit")
    assert "1024 bytes" in text and "shrink its body" in text
    assert "fewer messages" not in text and " carry " not in text

    # Among several, the one too big on its own is named: splitting would not help it.
    with pytest.raises(InvalidMessageError) as raised:
        check(
            [
                ServiceBusMessage(b"x", message_id="a"),
                ServiceBusMessage(b"x" * 2048, message_id="b"),
            ],
            max_size=1024,
        )
    assert "message 'b' (one of 2 in this call) has 2048 bytes" in str(raised.value)
    assert "fewer messages" not in str(raised.value)


async def test_the_sender_refuses_an_oversized_message_once_it_knows_the_limit() -> None:
    primary = InMemoryRegionSender("primary", "east.example", "orders", max_message_size=100)
    secondary = InMemoryRegionSender("secondary", "west.example", "orders", max_message_size=100)
    outbox = InMemoryOutbox()
    primary.fail_with("connection")
    async with GeoSender(primary, secondary, outbox=outbox) as sender:
        secondary_attempts = secondary.attempts
        with pytest.raises(InvalidMessageError):
            await sender.send_messages(FakeMessage(b"x" * 101))
        # Never sent anywhere, never queued.
        assert secondary.attempts == secondary_attempts and await outbox.depth() == 0


@pytest.mark.parametrize(
    "build",
    [
        lambda: PairedNamespaceOptions(backlog_queue_count="3"),  # type: ignore[arg-type]
        lambda: PairedNamespaceOptions(backlog_queue_count=2.5),  # type: ignore[arg-type]
        lambda: PairedNamespaceOptions(syphon_batch_size=1.5),  # type: ignore[arg-type]
        lambda: PairedNamespaceOptions(syphon_prefetch=True),
        lambda: PairedNamespaceOptions(failover_interval=float("nan")),
        lambda: FailoverPolicy(attempt_timeout=float("nan")),
        lambda: FailoverPolicy(attempt_timeout=float("inf")),
        lambda: DrainPolicy(batch_size="100"),  # type: ignore[arg-type]
        lambda: FailoverPolicy(fail_over_on=frozenset({"outage"})),  # type: ignore[arg-type]
        lambda: FailoverPolicy(fail_over_on=3),  # type: ignore[arg-type]
    ],
)
def test_wrong_option_types_raise_configuration_error(build: Any) -> None:
    with pytest.raises(ConfigurationError) as raised:
        build()
    assert isinstance(raised.value, GeoReplicationError)
    assert any(name in str(raised.value) for name in ("PairedNamespaceOptions.", "Policy."))


_STRING = "Endpoint=sb://east.example.net/;SharedAccessKeyName=a;SharedAccessKey=c2VjcmV0"


@pytest.mark.parametrize(
    ("primary", "queue", "says"),
    [
        (None, "q", "primary connection string must be a str, not NoneType"),
        (42, "q", "primary connection string must be a str, not int"),
        (b"Endpoint=sb://x/", "q", "primary connection string must be a str, not bytes"),
        (_STRING, "", "queue_name= must name the entity, got ''"),
    ],
)
def test_a_connection_string_or_entity_of_the_wrong_kind_is_named(
    primary: Any, queue: str, says: str
) -> None:
    # Before: None raised the SDK's TypeError, 42 and bytes were called "empty", and an
    # empty queue name raised the SDK's "Queue/Topic name is missing".
    from georep import GeoSender

    secondary = _STRING.replace("east", "west")
    with pytest.raises(ConfigurationError, match=re.escape(says)) as raised:
        GeoSender.from_connection_strings(primary, secondary, queue_name=queue)
    assert "c2VjcmV0" not in str(raised.value)
