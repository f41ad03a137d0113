"""The emulator's broker and codec, with an injected clock: no network, no sleeping."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from _emulator_parts import Clock, batch

from georep.adapters.emulator._broker import (
    BrokerError,
    EntityProperties,
    MessageState,
    Namespace,
    StoredMessage,
)
from georep.adapters.emulator._codec import (
    AmqpDecodeError,
    Symbol,
    Timestamp,
    decode_value,
    encode_value,
    parse_message,
    section_value_start,
    split_sections,
)


def message(
    body: bytes = b"x",
    *,
    message_id: Any = None,
    ttl_ms: int | None = None,
    annotations: dict[Any, Any] | None = None,
    app: dict[str, Any] | None = None,
    content_type: str | None = None,
) -> bytes:
    out = b""
    if ttl_ms is not None:
        out += b"\x00\x53\x70" + encode_value([False, None, ttl_ms])
    if annotations:
        out += b"\x00\x53\x72" + encode_value(annotations)
    out += b"\x00\x53\x73" + encode_value([message_id, None, None, None, None, None, content_type])
    if app:
        out += b"\x00\x53\x74" + encode_value(app)
    return out + b"\x00\x53\x75" + encode_value(body)


@dataclass(eq=False)
class FakeConsumer:
    credit: int = 0
    receive_and_delete: bool = False
    got: list[tuple[StoredMessage, uuid.UUID | None]] = field(default_factory=list)

    def deliver(self, msg: StoredMessage, lock_token: uuid.UUID | None) -> None:
        self.credit -= 1
        self.got.append((msg, lock_token))


def advance(ns: Namespace, broker_clock: Clock, seconds: float) -> None:
    broker_clock.now += seconds
    ns.run_timers()


def test_codec_round_trips_values() -> None:
    value = {
        Symbol("sym"): [1, -2, 2**40, "text", b"\x00\xff", None, True, 1.5],
        "ts": Timestamp(1234),
        "id": uuid.UUID(int=7),
    }
    decoded, end = decode_value(encode_value(value))
    assert decoded == value
    assert isinstance(decoded["ts"], Timestamp)
    assert end == len(encode_value(value))


def test_codec_rejects_malformed_payloads() -> None:
    with pytest.raises(AmqpDecodeError):
        split_sections(b"\x01\x02\x03")
    with pytest.raises(AmqpDecodeError):
        split_sections(b"\x00\x53\x75\xb0\x00\x00\x10\x00abc")  # truncated binary


def test_parse_keeps_bare_message_bytes_and_reads_fields() -> None:
    payload = message(
        b"hello", message_id="m1", ttl_ms=5000, annotations={Symbol("x-opt-partition-key"): "pk"}
    )
    parsed = parse_message(payload)
    assert parsed.message_id == "m1"
    assert parsed.ttl_ms == 5000
    assert parsed.annotations["x-opt-partition-key"] == "pk"
    assert payload.endswith(parsed.bare)
    assert parsed.bare.startswith(b"\x00\x53\x73")


def test_delivery_encoding_adds_broker_annotations_and_keeps_the_client_ones(ns: Namespace) -> None:
    q = ns.create_queue("q")
    ns.send(q, message(b"b", message_id="m", annotations={Symbol("x-opt-partition-key"): "pk"}))
    stored = q.available[0]
    token = uuid.uuid4()
    stored.locked_until = 2_000_000.0
    parsed = parse_message(stored.encode(lock_token=token))
    assert parsed.annotations["x-opt-partition-key"] == "pk"
    assert parsed.annotations["x-opt-sequence-number"] == stored.sequence_number
    assert parsed.annotations["x-opt-locked-until"] == 2_000_000_000
    assert parsed.bare == stored.bare


def test_dispatch_is_round_robin_and_respects_credit(ns: Namespace) -> None:
    q = ns.create_queue("q")
    a, b = FakeConsumer(credit=2), FakeConsumer(credit=1)
    q.add_consumer(a)
    q.add_consumer(b)
    for i in range(5):
        ns.send(q, message(message_id=f"m{i}"))
    assert [m.message_id for m, _ in a.got] == ["m0", "m2"]
    assert [m.message_id for m, _ in b.got] == ["m1"]
    assert len(q.available) == 2  # no credit left: the rest waits
    b.credit = 5
    q.dispatch()
    assert [m.message_id for m, _ in b.got] == ["m1", "m3", "m4"]


def test_batch_is_unpacked_into_messages(ns: Namespace) -> None:
    q = ns.create_queue("q")
    assert ns.send(q, batch(message(message_id="a"), message(message_id="b"))) == 2
    assert [m.message_id for m in q.available] == ["a", "b"]
    assert [m.sequence_number for m in q.available] == [1, 2]


def test_lock_expiry_returns_the_message_with_a_higher_delivery_count(
    ns: Namespace, broker_clock: Clock
) -> None:
    q = ns.create_queue("q", EntityProperties(lock_duration=timedelta(seconds=30)))
    consumer = FakeConsumer(credit=1)
    q.add_consumer(consumer)
    ns.send(q, message(message_id="m"))
    (_, token) = consumer.got[0]
    assert token is not None
    advance(ns, broker_clock, 29)
    assert q.locked and not q.available
    advance(ns, broker_clock, 2)
    assert not q.locked
    assert q.available[0].delivery_count == 1
    with pytest.raises(BrokerError) as info:
        q.complete(token)
    assert info.value.condition == "com.microsoft:message-lock-lost"


def test_renewed_lock_does_not_expire_at_the_old_time(ns: Namespace, broker_clock: Clock) -> None:
    q = ns.create_queue("q", EntityProperties(lock_duration=timedelta(seconds=10)))
    consumer = FakeConsumer(credit=1)
    q.add_consumer(consumer)
    ns.send(q, message())
    token = consumer.got[0][1]
    assert token is not None
    advance(ns, broker_clock, 8)
    assert q.renew_lock(token) == broker_clock.now + 10
    advance(ns, broker_clock, 5)  # past the first lock's end
    q.complete(token)
    assert q.message_count == 0


def first_of_two(ns: Namespace) -> tuple[Any, FakeConsumer]:
    """A queue (max delivery count 2) holding ``first`` and ``second``, and a consumer with
    credit for one, which it spent on ``first`` (locked)."""
    q = ns.create_queue("q", EntityProperties(max_delivery_count=2))
    ns.send(q, message(message_id="first"))
    ns.send(q, message(message_id="second"))
    consumer = FakeConsumer(credit=1)
    q.add_consumer(consumer)
    return q, consumer


def test_abandon_puts_the_message_first_and_max_delivery_dead_letters(ns: Namespace) -> None:
    q, consumer = first_of_two(ns)
    token = consumer.got[-1][1]
    assert token is not None
    q.abandon(token)
    assert q.available[0].message_id == "first"  # back at the head
    consumer.credit = 1
    q.dispatch()
    token = consumer.got[-1][1]
    assert token is not None
    q.abandon(token)  # second failed attempt: max_delivery_count reached
    assert q.dead_letter is not None
    [dead] = list(q.dead_letter.available)
    assert dead.message_id == "first"
    app = parse_message(dead.encode()).bare
    assert b"MaxDeliveryCountExceeded" in app
    assert [m.message_id for m in q.available if m.state is MessageState.AVAILABLE] == ["second"]


def test_release_returns_the_message_first_without_counting_a_delivery(ns: Namespace) -> None:
    q, consumer = first_of_two(ns)
    for _ in range(5):  # released unseen, again and again: never dead-lettered
        token = consumer.got[-1][1]
        assert token is not None
        consumer.credit = 1
        q.release(token)
        assert consumer.got[-1][0].message_id == "first"
    assert consumer.got[-1][0].delivery_count == 0
    token = consumer.got[-1][1]
    assert token is not None
    q.abandon(token)  # a failed attempt counts
    assert consumer.got[-1][0].delivery_count == 1
    assert q.dead_letter is not None and not q.dead_letter.by_sequence


def test_dead_letter_merges_reason_into_existing_application_properties(ns: Namespace) -> None:
    q = ns.create_queue("q")
    ns.send(q, message(app={"keep": "me", "DeadLetterReason": "old"}))
    consumer = FakeConsumer(credit=1)
    q.add_consumer(consumer)
    token = consumer.got[0][1]
    assert token is not None
    q.dead_letter_by_token(token, "Bad", "why")
    assert q.dead_letter is not None
    dead = q.dead_letter.available[0]
    sections = {code: (start, end) for code, start, end in split_sections(dead.bare)}
    start, _ = sections[0x74]
    props, _ = decode_value(dead.bare, section_value_start(dead.bare, start))
    assert props == {"keep": "me", "DeadLetterReason": "Bad", "DeadLetterErrorDescription": "why"}


def test_ttl_expiry_dead_letters_or_drops(ns: Namespace, broker_clock: Clock) -> None:
    keeping = ns.create_queue(
        "keeping", EntityProperties(dead_lettering_on_message_expiration=True)
    )
    dropping = ns.create_queue("dropping")
    for q in (keeping, dropping):
        ns.send(q, message(ttl_ms=1000))
    advance(ns, broker_clock, 1.5)
    assert keeping.active_count == 0
    assert keeping.runtime()["dead_letter_message_count"] == 1
    assert dropping.message_count == 0


def test_queue_default_ttl_caps_the_message_ttl(ns: Namespace, broker_clock: Clock) -> None:
    q = ns.create_queue("q", EntityProperties(default_message_time_to_live=timedelta(seconds=2)))
    ns.send(q, message(ttl_ms=60_000))
    advance(ns, broker_clock, 3)
    assert q.message_count == 0


def test_scheduled_message_becomes_available_at_its_time(
    ns: Namespace, broker_clock: Clock
) -> None:
    q = ns.create_queue("q")
    consumer = FakeConsumer(credit=10)
    q.add_consumer(consumer)
    at = Timestamp(int((broker_clock.now + 60) * 1000))
    ns.send(
        q, message(message_id="later", annotations={Symbol("x-opt-scheduled-enqueue-time"): at})
    )
    assert q.runtime()["scheduled_message_count"] == 1 and not consumer.got
    advance(ns, broker_clock, 59)
    assert not consumer.got
    advance(ns, broker_clock, 2)
    assert [m.message_id for m, _ in consumer.got] == ["later"]


def test_cancel_scheduled(ns: Namespace) -> None:
    q = ns.create_queue("q")
    seq = ns.schedule(q, message(), ns.clock() + 60)
    ns.cancel_scheduled(q, [seq])
    assert q.message_count == 0


def test_duplicate_detection_window(ns: Namespace, broker_clock: Clock) -> None:
    q = ns.create_queue(
        "q",
        EntityProperties(
            requires_duplicate_detection=True,
            duplicate_detection_history_time_window=timedelta(minutes=1),
        ),
    )
    ns.send(q, message(message_id="same"))
    ns.send(q, message(message_id="same"))
    assert q.message_count == 1
    broker_clock.now += 61
    ns.send(q, message(message_id="same"))  # outside the window: a new message
    assert q.message_count == 2


def test_ping_is_accepted_and_never_stored(ns: Namespace) -> None:
    q = ns.create_queue("q")
    ns.send(q, message(content_type="application/vnd.ms-servicebus-ping"))
    assert q.message_count == 0


def test_topic_fans_out_copies_with_one_sequence_number(ns: Namespace) -> None:
    ns.create_topic("t")
    a = ns.create_subscription("t", "a")
    b = ns.create_subscription("t", "b")
    ns.send(ns.resolve_target("t"), message(message_id="e"))
    assert a.available[0] is not b.available[0]
    assert a.available[0].sequence_number == b.available[0].sequence_number
    assert ns.resolve_source("t/Subscriptions/a/$DeadLetterQueue") is a.dead_letter


def test_oversize_and_unknown_entities_are_refused(ns: Namespace) -> None:
    q = ns.create_queue("q")
    with pytest.raises(BrokerError) as too_big:
        ns.send(q, message(b"x" * 300_000))
    assert too_big.value.condition == "amqp:link:message-size-exceeded"
    with pytest.raises(BrokerError) as missing:
        ns.resolve_target("nope")
    assert missing.value.condition == "amqp:not-found"


def test_defer_and_receive_deferred(ns: Namespace) -> None:
    q = ns.create_queue("q")
    consumer = FakeConsumer(credit=1)
    q.add_consumer(consumer)
    ns.send(q, message(message_id="d"))
    msg, token = consumer.got[0]
    assert token is not None
    q.defer(token)
    consumer.credit = 5
    q.dispatch()
    assert len(consumer.got) == 1  # deferred messages are not delivered again
    [(again, new_token)] = q.receive_deferred([msg.sequence_number], receive_and_delete=False)
    assert again is msg and new_token is not None
    q.complete(new_token)
    assert q.message_count == 0


def test_purge_loses_messages_but_keeps_entities(ns: Namespace) -> None:
    q = ns.create_queue("q")
    ns.send(q, message())
    ns.purge()
    assert ns.queues["q"] is q and q.message_count == 0
