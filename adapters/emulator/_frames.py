"""Delivery-id resequencing between the SDK and Proton's engine.

The SDK's pure-Python AMQP stack numbers a transfer with the session's next outgoing id
and only increments it after sending, with an ``await`` (async) or no lock (threads) in
between. Concurrent transfers on one session (``asyncio.gather`` of settlements that fall
back to ``$management``, of ``renew_message_lock``, ``AutoLockRenewer`` renewing several
messages) therefore arrive out of order, twice with one id, or with a gap. Proton's
``pn_do_transfer`` requires each new delivery's id to be exactly the previous one plus
one, and closes the connection with ``amqp:session:invalid-field`` ("sequencing error")
otherwise. Azure accepts them.

:class:`DeliveryIdSequencer` sits where bytes enter and leave the engine. Incoming, it
renumbers every new delivery (the first frame of a transfer; continuation frames of a
multi-frame transfer follow it) to the id Proton expects. Outgoing, for the deliveries it
renumbered and that are unsettled, it puts the client's own ids back into Proton's
dispositions, so the SDK matches each outcome to its transfer. The cost on a connection
whose ids are in order: a frame-header read per frame, a read of each incoming transfer's
first fields, and no copy of the bytes.

Only the client's dispositions as *sender* would also name renumbered ids; the SDK never
sends them (the emulator settles every transfer it answers), so they pass unchanged.
"""

from __future__ import annotations

__all__ = ["DeliveryIdSequencer"]

import struct
from collections.abc import Callable

from ._codec import AmqpDecodeError, skip_value

_HEADER = struct.Struct(">IBBH")  # size, data offset (words), type, channel
_U32 = struct.Struct(">I")
_PROTOCOL_HEADER = b"AMQP"
_AMQP_FRAME = 0
_BEGIN, _TRANSFER, _DISPOSITION, _END = 0x11, 0x14, 0x15, 0x17
_MASK = 0xFFFFFFFF
# A transfer's performative (without a delivery state, which the SDK never sends) fits in
# this much; the frame's payload after it passes through untouched.
_TRANSFER_HEAD = 512
# Called with a frame's head (header and performative), its channel, performative code and
# the performative's offset; returns a replacement head, or None to keep the frame.
_FrameHandler = Callable[[bytes, int, int, int], "bytes | None"]


class _Session:
    """Delivery-id state of one session, keyed by the client's channel."""

    __slots__ = ("continuing", "expected", "renumbered")

    def __init__(self) -> None:
        self.expected: int | None = None  # the id Proton expects next (set by the first)
        self.continuing: dict[int, int] = {}  # handle -> id of its unfinished delivery
        self.renumbered: dict[int, int] = {}  # Proton's id -> the client's, unsettled only


class _FrameCursor:
    """Splits one direction's byte stream into frames across reads."""

    __slots__ = ("codes", "passthrough", "pending")

    def __init__(self, codes: frozenset[int]) -> None:
        self.codes = codes  # the performatives whose frames the handler sees
        self.pending = b""  # an incomplete frame head, waiting for more bytes
        self.passthrough = 0  # bytes of the current frame still to forward as they are


class DeliveryIdSequencer:
    """Per connection: renumber incoming transfers, map Proton's dispositions back."""

    __slots__ = ("_in", "_out", "_out_channels", "_renumbered", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[int, _Session] = {}  # the client's channel -> state
        self._out_channels: dict[int, int] = {}  # Proton's channel -> the client's
        self._renumbered = 0  # entries in every session's ``renumbered`` map
        self._in = _FrameCursor(frozenset({_BEGIN, _TRANSFER, _END}))
        self._out = _FrameCursor(frozenset({_BEGIN, _DISPOSITION}))

    # -- incoming -----------------------------------------------------------------------
    def incoming(self, data: bytes) -> bytes:
        """The bytes to give Proton for ``data`` read from the client."""
        return _rewrite(self._in, data, self._incoming_frame)

    def _incoming_frame(self, head: bytes, channel: int, code: int, body: int) -> bytes | None:
        if code != _TRANSFER:
            self._drop(channel)
            if code == _BEGIN:
                self._sessions[channel] = _Session()
            return None
        session = self._sessions.get(channel)
        if session is None:
            session = self._sessions[channel] = _Session()
        fields = _fields(head, body, 9)
        handle = _uint(head, fields[0])
        sent_id = _uint(head, fields[1])
        if handle is None:
            return None
        continued = session.continuing.get(handle)
        if continued is not None:
            wanted = continued  # a continuation frame: its delivery's id, whatever was sent
        else:
            if session.expected is None:  # Proton starts from the first transfer's id
                session.expected = sent_id or 0
            wanted = session.expected
            session.expected = (wanted + 1) & _MASK
            if sent_id is not None and sent_id != wanted and not _bool(head, fields[4]):
                session.renumbered[wanted] = sent_id
                self._renumbered += 1
        if _bool(head, fields[5]) and not _bool(head, fields[8]):  # more, not aborted
            session.continuing[handle] = wanted
        else:
            session.continuing.pop(handle, None)
        if sent_id is None or sent_id == wanted:
            return None
        start = fields[1]
        assert start is not None
        leading = head[_list_start(head, body) : start] + _encode_uint(wanted)
        return _head_with_fields(head, body, leading, 2, skip_value(head, start))

    # -- outgoing -----------------------------------------------------------------------
    def outgoing(self, data: bytes) -> bytes:
        """The bytes to send the client for ``data`` Proton produced."""
        return _rewrite(self._out, data, self._outgoing_frame)

    def _outgoing_frame(self, head: bytes, channel: int, code: int, body: int) -> bytes | None:
        if code == _BEGIN:
            remote = _fields(head, body, 1)[0]
            if remote is not None and head[remote] == 0x60:
                self._out_channels[channel] = int.from_bytes(head[remote + 1 : remote + 3])
            return None
        if not self._renumbered:
            return None
        session = self._sessions.get(self._out_channels.get(channel, channel))
        if session is None or not session.renumbered:
            return None
        fields = _fields(head, body, 4)
        first = _uint(head, fields[1])
        if not _bool(head, fields[0]) or first is None or fields[0] is None:
            return None  # role sender: it names Proton's own deliveries
        last = _uint(head, fields[2])
        settled = _bool(head, fields[3])
        mapping = session.renumbered
        runs: list[list[int]] = []
        changed = False
        for proton_id in range(first, (first if last is None else last) + 1):
            client_id = mapping.pop(proton_id, None) if settled else mapping.get(proton_id)
            if client_id is None:
                client_id = proton_id
            else:
                changed = True
                self._renumbered -= int(settled)
            if runs and runs[-1][1] + 1 == client_id:
                runs[-1][1] = client_id
            else:
                runs.append([client_id, client_id])
        if not changed:
            return None
        # Per run of the client's ids: role, first, last, then this frame's own fields from
        # settled on (state, batchable).
        role = head[fields[0] : skip_value(head, fields[0])]
        return b"".join(
            _head_with_fields(
                head, body, role + _encode_uint(low) + _encode_uint(high), 3, fields[3]
            )
            for low, high in runs
        )

    def _drop(self, channel: int) -> None:
        session = self._sessions.pop(channel, None)
        if session is not None:
            self._renumbered -= len(session.renumbered)


# -- frame plumbing -----------------------------------------------------------------------
def _rewrite(cursor: _FrameCursor, data: bytes, on_frame: _FrameHandler) -> bytes:
    """Walk ``data`` frame by frame, continuing where the last call stopped; ``on_frame``
    may replace a frame's head. Returns ``data`` itself when nothing changed and no frame
    head is incomplete (the common case: no copy)."""
    if cursor.pending:
        data = cursor.pending + data
        cursor.pending = b""
    size = len(data)
    if cursor.passthrough >= size:
        cursor.passthrough -= size
        return data
    pos = cursor.passthrough
    cursor.passthrough = 0
    parts: list[bytes] = []
    copied = 0  # data[:copied] is in parts already
    end = size
    while pos < size:
        if size - pos < 8:
            end = pos
            break
        if data[pos : pos + 4] == _PROTOCOL_HEADER:
            pos += 8
            continue
        frame_size, offset, kind, channel = _HEADER.unpack_from(data, pos)
        body = offset * 4
        if frame_size < 8 or body < 8:
            # Not a frame we can walk: give up on this stream, Proton will refuse it.
            cursor.passthrough = 1 << 62
            break
        if kind != _AMQP_FRAME or frame_size < body + 4:
            pos = _skip(cursor, pos, frame_size, size)
            continue
        if size - pos < body + 3:
            end = pos
            break
        code = data[pos + body + 2]
        if data[pos + body : pos + body + 2] != b"\x00\x53" or code not in cursor.codes:
            pos = _skip(cursor, pos, frame_size, size)
            continue
        head_size = min(frame_size, _TRANSFER_HEAD) if code == _TRANSFER else frame_size
        if size - pos < head_size:
            end = pos
            break
        head = data[pos : pos + head_size]
        try:
            replaced = on_frame(head, channel, code, body)
        except (AmqpDecodeError, IndexError, KeyError, struct.error):
            replaced = None  # malformed: Proton reports it itself
        if replaced is not None:
            consumed = skip_value(head, body) if code == _TRANSFER else frame_size
            parts.append(data[copied:pos])
            parts.append(_sized(replaced, frame_size - consumed))
            copied = pos + consumed
        pos = _skip(cursor, pos, frame_size, size)
    cursor.pending = data[end:]
    if not parts:
        return data if end == size else data[:end]
    parts.append(data[copied:end])
    return b"".join(parts)


def _skip(cursor: _FrameCursor, pos: int, frame_size: int, size: int) -> int:
    end = pos + frame_size
    if end > size:
        cursor.passthrough = end - size
        return size
    return end


def _sized(heads: bytes, payload: int) -> bytes:
    """``heads``: frame heads whose size fields count only the head; the last one is
    followed by ``payload`` bytes of the original frame: add them to its size."""
    if not payload:
        return heads
    out = bytearray(heads)
    pos = 0
    while True:
        length = _U32.unpack_from(out, pos)[0]
        if pos + length >= len(out):
            _U32.pack_into(out, pos, length + payload)
            return bytes(out)
        pos += length


def _fields(head: bytes, body: int, count: int) -> list[int | None]:
    """Offsets (in ``head``) of a performative's first ``count`` fields; None when absent."""
    pos = _list_start(head, body)
    offsets: list[int | None] = []
    for _ in range(min(count, _list_count(head, body))):
        offsets.append(pos)
        pos = skip_value(head, pos)
    offsets.extend([None] * (count - len(offsets)))
    return offsets


def _list_start(head: bytes, body: int) -> int:
    return body + 3 + {0x45: 1, 0xC0: 3, 0xD0: 9}[head[body + 3]]


def _list_count(head: bytes, body: int) -> int:
    code = head[body + 3]
    if code == 0xC0:
        return head[body + 5]
    if code == 0xD0:
        return int(_U32.unpack_from(head, body + 8)[0])
    return 0


def _uint(head: bytes, pos: int | None) -> int | None:
    """A uint field (None when absent or null)."""
    if pos is None:
        return None
    code = head[pos]
    if code == 0x70:
        return int(_U32.unpack_from(head, pos + 1)[0])
    if code == 0x52:
        return head[pos + 1]
    if code == 0x43:
        return 0
    if code == 0x40:
        return None
    raise AmqpDecodeError(f"not a uint: 0x{code:02x}")


def _bool(head: bytes, pos: int | None) -> bool:
    if pos is None:
        return False
    code = head[pos]
    return code == 0x41 or (code == 0x56 and head[pos + 1] == 1)


def _encode_uint(value: int) -> bytes:
    return b"\x70" + _U32.pack(value)


def _head_with_fields(
    head: bytes, body: int, leading: bytes, leading_count: int, rest_at: int | None
) -> bytes:
    """A frame head: ``head``'s frame header and descriptor, then a list of ``leading``
    (``leading_count`` fields) and ``head``'s own fields from offset ``rest_at`` on. Its
    size field counts the head alone."""
    if rest_at is None:
        rest, count = b"", leading_count
    else:
        rest = head[rest_at : skip_value(head, body)]
        count = max(leading_count, _list_count(head, body))
    content = leading + rest
    if len(content) < 255 and count < 256:
        listed = b"\xc0" + bytes((len(content) + 1, count)) + content
    else:
        listed = b"\xd0" + _U32.pack(len(content) + 4) + _U32.pack(count) + content
    new_head = head[:body] + head[body : body + 3] + listed
    return _U32.pack(len(new_head)) + new_head[4:]
