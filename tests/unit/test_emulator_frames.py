"""Delivery-id resequencing at the engine boundary (_frames), on hand-built AMQP frames."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from georep.adapters.emulator._codec import decode_value
from georep.adapters.emulator._frames import DeliveryIdSequencer

_HEADER = struct.Struct(">IBBH")
PROTOCOL_HEADER = b"AMQP\x00\x01\x00\x00"


def _uint(value: int) -> bytes:
    return b"\x70" + struct.pack(">I", value)


def _bool(value: bool) -> bytes:
    return b"\x41" if value else b"\x42"


def _frame(code: int, fields: list[bytes], payload: bytes = b"", channel: int = 0) -> bytes:
    content = b"".join(fields)
    body = b"\x00\x53" + bytes((code, 0xC0, len(content) + 1, len(fields))) + content + payload
    return _HEADER.pack(8 + len(body), 2, 0, channel) + body


def begin(channel: int = 0, remote_channel: int | None = None) -> bytes:
    remote = b"\x40" if remote_channel is None else b"\x60" + struct.pack(">H", remote_channel)
    return _frame(0x11, [remote, _uint(0), _uint(100), _uint(100)], channel=channel)


def transfer(
    delivery_id: int | None,
    *,
    handle: int = 0,
    more: bool = False,
    settled: bool = False,
    payload: bytes = b"payload",
) -> bytes:
    fields = [
        _uint(handle),
        b"\x40" if delivery_id is None else _uint(delivery_id),
        b"\xa0\x02t" + bytes((handle,)),
        _uint(0),
        _bool(settled),
        _bool(more),
    ]
    return _frame(0x14, fields, payload)


def disposition(first: int, last: int, *, channel: int = 0, settled: bool = True) -> bytes:
    accepted = b"\x00\x53\x24\x45"
    fields = [_bool(True), _uint(first), _uint(last), _bool(settled), accepted]
    return _frame(0x15, fields, channel=channel)


def frames(data: bytes) -> list[tuple[int, list[Any], bytes]]:
    """(performative code, fields, payload) of every frame after the protocol header."""
    assert data.startswith(PROTOCOL_HEADER)
    pos, out = len(PROTOCOL_HEADER), []
    while pos < len(data):
        size, offset, _kind, _channel = _HEADER.unpack_from(data, pos)
        (code, fields), end = decode_value(data[: pos + size], pos + offset * 4)
        out.append((code, fields, data[end : pos + size]))
        pos += size
    return out


def transfer_ids(data: bytes) -> list[int]:
    return [fields[1] for code, fields, _ in frames(data) if code == 0x14]


@pytest.fixture
def sequencer() -> DeliveryIdSequencer:
    return DeliveryIdSequencer()


def test_in_order_transfers_pass_through_uncopied(sequencer: DeliveryIdSequencer) -> None:
    data = PROTOCOL_HEADER + begin() + transfer(0) + transfer(1) + transfer(2)
    assert sequencer.incoming(data) is data


def test_out_of_order_duplicate_and_gapped_ids_become_consecutive(
    sequencer: DeliveryIdSequencer,
) -> None:
    stream = [transfer(i) for i in (4, 6, 5, 5, 8, 9)]
    out = sequencer.incoming(PROTOCOL_HEADER + begin() + b"".join(stream))
    assert transfer_ids(out) == [4, 5, 6, 7, 8, 9]
    assert [payload for code, _, payload in frames(out) if code == 0x14] == [b"payload"] * 6


def test_byte_by_byte_reads_give_the_same_stream(sequencer: DeliveryIdSequencer) -> None:
    data = PROTOCOL_HEADER + begin() + transfer(3) + transfer(5, payload=b"x" * 300) + transfer(4)
    out = b"".join(sequencer.incoming(data[i : i + 1]) for i in range(len(data)))
    assert transfer_ids(out) == [3, 4, 5]
    assert out == DeliveryIdSequencer().incoming(data)


def test_continuation_frames_keep_their_delivery_id(sequencer: DeliveryIdSequencer) -> None:
    data = (
        PROTOCOL_HEADER
        + begin()
        + transfer(0)
        + transfer(2, handle=1, more=True)  # expected 1
        + transfer(2, handle=1, more=True)
        + transfer(None, handle=1)
        + transfer(3)  # expected 2
    )
    assert transfer_ids(sequencer.incoming(data)) == [0, 1, 1, None, 2]


def test_dispositions_name_the_ids_the_client_sent(sequencer: DeliveryIdSequencer) -> None:
    sequencer.incoming(PROTOCOL_HEADER + begin() + transfer(0) + transfer(2) + transfer(1))
    # Proton answers its ids 0..2 in one range; the client sent 0, 2, 1.
    out = sequencer.outgoing(PROTOCOL_HEADER + begin(0, remote_channel=0) + disposition(0, 2))
    ranges = [(fields[1], fields[2]) for code, fields, _ in frames(out) if code == 0x15]
    assert ranges == [(0, 0), (2, 2), (1, 1)]
    states = {repr(fields[4]) for code, fields, _ in frames(out) if code == 0x15}
    assert len(states) == 1  # every split frame keeps the outcome
    # Settled: the mapping is gone, a later disposition passes as it is.
    later = disposition(0, 2)
    assert sequencer.outgoing(later) is later


def test_disposition_on_another_session_channel_is_mapped_through_begin(
    sequencer: DeliveryIdSequencer,
) -> None:
    # The client's session is on channel 3, Proton's answer on channel 0. Proton numbers
    # from the first transfer's id: the client's 1, 0 are its 1, 2.
    sequencer.incoming(
        PROTOCOL_HEADER
        + begin(channel=3)
        + _frame(0x14, [_uint(0), _uint(1), b"\xa0\x01t", _uint(0), _bool(False)], channel=3)
        + _frame(0x14, [_uint(0), _uint(0), b"\xa0\x01u", _uint(0), _bool(False)], channel=3)
    )
    out = sequencer.outgoing(PROTOCOL_HEADER + begin(0, remote_channel=3) + disposition(1, 2))
    assert [(f[1], f[2]) for code, f, _ in frames(out) if code == 0x15] == [(1, 1), (0, 0)]


def test_settled_transfers_need_no_mapping(sequencer: DeliveryIdSequencer) -> None:
    sequencer.incoming(
        PROTOCOL_HEADER + begin() + transfer(1, settled=True) + transfer(0, settled=True)
    )
    answer = PROTOCOL_HEADER + begin(0, remote_channel=0) + disposition(0, 1)
    assert sequencer.outgoing(answer) is answer


def test_a_new_session_on_the_channel_starts_afresh(sequencer: DeliveryIdSequencer) -> None:
    sequencer.incoming(PROTOCOL_HEADER + begin() + transfer(7) + transfer(9))
    end = _frame(0x17, [])
    out = sequencer.incoming(end + begin() + transfer(0) + transfer(1))
    assert [fields[1] for code, fields, _ in frames(PROTOCOL_HEADER + out) if code == 0x14] == [
        0,
        1,
    ]
