"""The emulator's AMQP value codec: every constructor decodes to its value, and malformed
input is an AmqpDecodeError (the broker refuses the transfer), never another exception."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

from georep.adapters.emulator import _codec as codec
from georep.adapters.emulator._codec import AmqpDecodeError, Symbol, Timestamp

ROUND_TRIPS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**62,
    1.5,
    Timestamp(1_700_000_000_123),
    "",
    "short",
    "é" * 300,  # over 255 bytes: the 32-bit string constructor
    Symbol("x-opt-partition-key"),
    Symbol("s" * 300),
    b"",
    b"\x00\x01",
    b"b" * 300,
    uuid.UUID("0f1e2d3c-aaaa-bbbb-cccc-000000000001"),
    [],
    [None, "a", [1, 2]],
    {"k": "v", Symbol("n"): None},
    ["x" * 300, {"deep": [None] * 10}],
]


@pytest.mark.parametrize("value", ROUND_TRIPS, ids=lambda value: type(value).__name__)
def test_a_value_decodes_to_what_was_encoded_with_its_type(value: Any) -> None:
    encoded = codec.encode_value(value)
    decoded, end = codec.decode_value(encoded)
    assert decoded == value and type(decoded) is type(value)
    assert end == len(encoded) == codec.skip_value(encoded, 0)
    assert codec.decode_value(memoryview(encoded))[0] == value  # the broker also reads views


COMPACT: list[tuple[bytes, Any]] = [
    (b"\x43", 0),  # uint0
    (b"\x44", 0),  # ulong0
    (b"\x45", []),  # list0
    (b"\x50\xff", 255),  # ubyte
    (b"\x51\xff", -1),  # byte
    (b"\x52\x07", 7),  # smalluint
    (b"\x53\x07", 7),  # smallulong
    (b"\x54\xfe", -2),  # smallint
    (b"\x55\x80", -128),  # smalllong
    (b"\x56\x01", True),  # boolean with a value byte
    (b"\x60\x01\x00", 256),  # ushort
    (b"\x61\xff\xff", -1),  # short
    (b"\x70\x00\x01\x00\x00", 65536),  # uint
    (b"\x71\xff\xff\xff\xfe", -2),  # int
    (b"\x72" + struct.pack(">f", 2.5), 2.5),  # float
    (b"\x80" + struct.pack(">Q", 2**63), 2**63),  # ulong
    (b"\xc0\x03\x02\x40\x41", [None, True]),  # list8
    (b"\xc1\x04\x02\xa1\x00\x40", {"": None}),  # map8
    (b"\xd0\x00\x00\x00\x05\x00\x00\x00\x01\x40", [None]),  # list32
    (b"\xe0\x06\x02\xa1\x01a\x01b", ["a", "b"]),  # array8 of str8
    (b"\x00\x53\x70\x45", (0x70, [])),  # described
    (b"\x73abcd", b"abcd"),  # char: the raw bytes
    (b"\x94" + bytes(range(16)), bytes(range(16))),  # decimal128: the raw bytes
]


@pytest.mark.parametrize(("encoded", "value"), COMPACT, ids=lambda item: repr(item)[:16])
def test_each_compact_constructor_decodes(encoded: bytes, value: Any) -> None:
    assert codec.decode_value(encoded) == (value, len(encoded))
    assert codec.skip_value(encoded, 0) == len(encoded)


@pytest.mark.parametrize(
    ("encoded", "message"),
    [
        (b"\xff", "unknown AMQP type constructor 0xff"),
        (b"\xa1\x02\xff\xfe", "malformed"),  # not UTF-8
        (b"\x71\x00", "malformed"),  # an int cut short
        (b"", "malformed"),
    ],
)
def test_malformed_input_is_an_amqp_decode_error(encoded: bytes, message: str) -> None:
    with pytest.raises(AmqpDecodeError, match=message):
        codec.decode_value(encoded)


@pytest.mark.parametrize("encoded", [b"\xa1\x05ab", b"\xb0\x00\x00", b"\x00\x53", b"\xff"])
def test_skipping_malformed_input_is_an_amqp_decode_error(encoded: bytes) -> None:
    """How a message's sections are found: a value cut short is caught here (decoding
    reads only what it needs)."""
    with pytest.raises(AmqpDecodeError):
        codec.skip_value(encoded, 0)


def test_an_sdk_message_parses_to_its_properties_and_annotations() -> None:
    message = ServiceBusMessage(
        b"x" * 200,
        message_id="id-1",
        session_id="s-1",
        content_type="text/plain",
        application_properties={"n": 5},
    )
    message.raw_amqp_message.annotations = {"x-opt-partition-key": "s-1"}
    amqp = PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message)
    parsed = codec.parse_message(bytes(encode_payload(bytearray(), amqp)))
    assert (parsed.message_id, parsed.session_id, parsed.content_type) == (
        "id-1",
        "s-1",
        "text/plain",
    )
    assert parsed.annotations == {"x-opt-partition-key": "s-1"}
    ((start, end),) = parsed.data_sections
    assert parsed.payload[start:end] == b"x" * 200
