"""Session order stamps on the sending side: session ids kept, order numbered per writer."""

from __future__ import annotations

from azure.servicebus import ServiceBusMessage

from georep import ErrorKind, GeoSender, ReplicationMode, RoleState
from georep.adapters.servicebus._backlog import from_backlog, to_backlog
from georep.adapters.servicebus._codec import ServiceBusCodec
from georep.send.ordering import (
    GENERATION_PROPERTY,
    PREV_PROPERTY,
    SEQ_PROPERTY,
    WRITER_PROPERTY,
    read_stamp,
)
from georep.testing import FakeMessage, InMemoryOutbox, InMemoryRegionSender


def _pair() -> tuple[InMemoryRegionSender, InMemoryRegionSender]:
    return (
        InMemoryRegionSender("primary", "east.example", "orders"),
        InMemoryRegionSender("secondary", "west.example", "orders"),
    )


def _sender(primary: InMemoryRegionSender, secondary: InMemoryRegionSender, **kw: object):
    kw.setdefault("role_state", RoleState(primary.namespace))
    return GeoSender(primary, secondary, **kw)  # type: ignore[arg-type]


def _stamp(message: FakeMessage):
    stamp = read_stamp(message.application_properties.get)
    assert stamp is not None
    return stamp


async def test_messages_of_a_session_are_numbered_and_chained_per_session() -> None:
    primary, secondary = _pair()
    async with _sender(primary, secondary) as sender:
        for i in range(3):
            await sender.send_messages(FakeMessage(b"a", message_id=f"a{i}", session_id="A"))
        await sender.send_messages(FakeMessage(b"b", message_id="b0", session_id="B"))
        await sender.send_messages(FakeMessage(b"plain", message_id="p"))

    stamps = {m.message_id: m.application_properties for m in primary.accepted}
    assert [stamps[f"a{i}"][SEQ_PROPERTY] for i in range(3)] == ["1", "2", "3"]
    assert PREV_PROPERTY not in stamps["a0"]
    assert stamps["a1"][PREV_PROPERTY] == "a0" and stamps["a2"][PREV_PROPERTY] == "a1"
    assert stamps["b0"][SEQ_PROPERTY] == "1" and PREV_PROPERTY not in stamps["b0"]
    assert len({stamps[k][WRITER_PROPERTY] for k in ("a0", "a2", "b0")}) == 1
    assert WRITER_PROPERTY not in stamps["p"]  # no session: not ordered, not stamped
    assert [m.session_id for m in primary.accepted] == ["A", "A", "A", "B", None]


async def test_the_generation_stamp_follows_a_failover_and_both_active_copies_agree() -> None:
    primary, secondary = _pair()
    async with _sender(primary, secondary) as sender:
        await sender.send_messages(FakeMessage(b"1", message_id="m1", session_id="S"))
        primary.fail_with(ErrorKind.CONNECTION)
        await sender.send_messages(FakeMessage(b"2", message_id="m2", session_id="S"))
        await sender.send_messages(FakeMessage(b"3", message_id="m3", session_id="S"))
    assert _stamp(primary.accepted[0]).generation == 0
    # The generation is the one the send started under: m2 failed over, m3 came after.
    moved, after = (_stamp(m) for m in secondary.accepted)
    assert (moved.generation, moved.seq, moved.prev) == (0, 2, "m1")
    assert (after.generation, after.seq, after.prev) == (1, 3, "m2")
    assert secondary.accepted[0].session_id == "S"

    primary, secondary = _pair()
    async with _sender(primary, secondary, mode=ReplicationMode.ACTIVE) as sender:
        await sender.send_messages([FakeMessage(b"x", session_id="S") for _ in range(2)])
    assert [m.application_properties for m in primary.accepted] == [
        m.application_properties for m in secondary.accepted
    ]
    assert [m.session_id for m in secondary.accepted] == ["S", "S"]


async def test_a_retried_message_keeps_its_stamp_and_a_new_writer_starts_a_new_chain() -> None:
    primary, secondary = _pair()
    message = FakeMessage(b"1", message_id="m1", session_id="S")
    async with _sender(primary, secondary) as sender:
        await sender.send_messages(message)
        await sender.send_messages(message)  # the caller retries the same object
        await sender.send_messages(FakeMessage(b"2", message_id="m2", session_id="S"))
    assert [_stamp(m).seq for m in primary.accepted] == [1, 1, 2]
    async with _sender(primary, secondary) as again:  # a retry with a new object, same id
        await again.send_messages(FakeMessage(b"x", message_id="r1", session_id="R"))
        await again.send_messages(FakeMessage(b"y", message_id="r2", session_id="R"))
        await again.send_messages(FakeMessage(b"y", message_id="r2", session_id="R"))
    assert [(_stamp(m).seq, _stamp(m).prev) for m in primary.accepted[-2:]] == [
        (2, "r1"),
        (2, "r1"),
    ]
    async with _sender(primary, secondary) as other:
        await other.send_messages(FakeMessage(b"3", message_id="m3", session_id="S"))
    third = _stamp(primary.accepted[-1])
    assert (third.seq, third.prev) == (1, None)
    assert third.writer != _stamp(primary.accepted[0]).writer


async def test_the_outbox_keeps_the_session_id_and_the_stamps() -> None:
    primary, secondary = _pair()
    outbox = InMemoryOutbox()
    primary.fail_with(ErrorKind.CONNECTION)
    secondary.fail_with(ErrorKind.CONNECTION)
    async with _sender(primary, secondary, outbox=outbox) as sender:
        result = await sender.send_messages(FakeMessage(b"q", message_id="q1", session_id="S"))
        assert result.queued
        primary.restore()
        secondary.restore()
        await sender.drain_outbox()
    delivered = (primary.accepted + secondary.accepted)[0]
    assert delivered.session_id == "S" and _stamp(delivered).seq == 1


def test_the_sdk_codec_and_the_backlog_rewrite_keep_session_and_stamps() -> None:
    codec = ServiceBusCodec()
    message = ServiceBusMessage(b"x", session_id="S", message_id="m1")
    codec.set_application_property(message, SEQ_PROPERTY, "4")
    codec.set_application_property(message, WRITER_PROPERTY, "w")
    codec.set_application_property(message, GENERATION_PROPERTY, "2")
    assert codec.session_id(message) == "S"
    decoded = codec.decode(codec.encode(message))
    assert decoded.session_id == "S" and codec.application_property(decoded, SEQ_PROPERTY) == "4"
    backlog = to_backlog(message, "orders")
    assert backlog.session_id is None  # a backlog queue is not session-enabled
    _, restored = from_backlog(backlog)
    assert restored.session_id == "S"
    stamp = read_stamp(lambda name: (restored.application_properties or {}).get(name))
    assert stamp is not None and (stamp.writer, stamp.seq, stamp.generation) == ("w", 4, 2)
