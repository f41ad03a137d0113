"""Partitioned entities in the emulator's broker (Standard tier), with an injected clock."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from _emulator_parts import Clock, batch

from georep.adapters.emulator._broker import (
    MAX_PARTITIONED_ENTITIES,
    PARTITION_COUNT,
    BrokerError,
    Entity,
    EntityProperties,
    Namespace,
    StoredMessage,
    fragment_of,
)
from georep.adapters.emulator._codec import Symbol, encode_value

PARTITIONED = EntityProperties(enable_partitioning=True)
PARTITIONED_DEDUP = EntityProperties(enable_partitioning=True, requires_duplicate_detection=True)


def message(
    body: bytes = b"x",
    *,
    message_id: Any = None,
    session_id: str | None = None,
    partition_key: str | None = None,
) -> bytes:
    out = b""
    if partition_key is not None:
        out += b"\x00\x53\x72" + encode_value({Symbol("x-opt-partition-key"): partition_key})
    properties = [message_id, None, None, None, None, None, None, None, None, None, session_id]
    out += b"\x00\x53\x73" + encode_value(properties)
    return out + b"\x00\x53\x75" + encode_value(body)


def key_in(fragment: int, prefix: str = "k") -> str:
    """A key whose fragment is ``fragment``."""
    for i in range(10_000):
        if fragment_of(f"{prefix}{i}") == fragment:
            return f"{prefix}{i}"
    raise AssertionError("no key found")


@dataclass(eq=False)
class FakeConsumer:
    credit: int = 0
    receive_and_delete: bool = True
    got: list[StoredMessage] = field(default_factory=list)

    def deliver(self, msg: StoredMessage, lock_token: uuid.UUID | None) -> None:
        self.credit -= 1
        self.got.append(msg)


@pytest.fixture
def ns() -> Namespace:
    return Namespace("primary", clock=Clock())


def stored(queue: Entity) -> list[StoredMessage]:
    return [m for _, m in sorted(queue.by_sequence.items())]


# -- fragment choice --------------------------------------------------------------------


def test_session_id_wins_over_partition_key_and_message_id(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED_DEDUP)
    ns.send(q, message(message_id="m1", session_id="s1", partition_key="s1"))
    ns.send(q, message(message_id="m2", session_id="s2"))
    first, second = stored(q)
    assert first.fragment == fragment_of("s1")
    assert second.fragment == fragment_of("s2")


def test_partition_key_then_message_id_with_dedup(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED_DEDUP)
    ns.send(q, message(message_id="m1", partition_key="pk"))
    ns.send(q, message(message_id="m2"))
    by_key, by_id = stored(q)
    assert by_key.fragment == fragment_of("pk")
    assert by_id.fragment == fragment_of("m2")


def test_message_id_is_not_a_key_without_dedup_round_robin_instead(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED)
    for _ in range(PARTITION_COUNT + 2):
        ns.send(q, message(message_id="same"))
    fragments = [m.fragment for m in stored(q)]
    assert fragments == [*range(PARTITION_COUNT), 0, 1]


def test_non_partitioned_entity_has_no_fragments(ns: Namespace) -> None:
    q = ns.create_queue("q")
    ns.send(q, message(partition_key="pk"))
    assert stored(q)[0].fragment is None
    assert q.partitioned is False


def test_session_id_and_different_partition_key_are_refused_everywhere(ns: Namespace) -> None:
    for name, properties in (("p", PARTITIONED), ("plain", EntityProperties())):
        q = ns.create_queue(name, properties)
        with pytest.raises(BrokerError) as caught:
            ns.send(q, message(session_id="a", partition_key="b"))
        assert caught.value.condition == "com.microsoft:invalid-operation"
        ns.send(q, message(session_id="a", partition_key="a"))  # equal is fine
        assert len(q.by_sequence) == 1


# -- fragment faults ----------------------------------------------------------------------


def test_keyed_send_to_down_fragment_fails_unkeyed_skips_it(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED)
    ns.fragment_down("q", 0)
    with pytest.raises(BrokerError) as caught:
        ns.send(q, message(partition_key=key_in(0)))
    assert caught.value.condition == "com.microsoft:timeout"
    with pytest.raises(BrokerError):
        ns.send(q, message(session_id=key_in(0, "s")))
    for _ in range(PARTITION_COUNT - 1):
        ns.send(q, message())
    assert sorted(m.fragment for m in stored(q)) == list(range(1, PARTITION_COUNT))
    ns.send(q, message(partition_key=key_in(1)))  # other fragments take keyed sends
    assert ns.fragments_down() == {"q": [0]}
    ns.fragment_up("q", 0)
    ns.send(q, message(partition_key=key_in(0)))
    assert ns.fragments_down() == {}


def test_dedup_message_id_key_fails_when_its_fragment_is_down(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED_DEDUP)
    ns.fragment_down("q", 5)
    with pytest.raises(BrokerError):
        ns.send(q, message(message_id=key_in(5, "m")))


def test_a_batch_with_one_keyed_message_on_a_down_fragment_stores_nothing(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED)
    ns.fragment_down("q", 3)
    with pytest.raises(BrokerError):
        ns.send(q, batch(message(partition_key=key_in(1)), message(partition_key=key_in(3))))
    assert not q.by_sequence


def test_all_fragments_down_fails_unkeyed_sends(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED)
    for i in range(PARTITION_COUNT):
        ns.fragment_down("q", i)
    with pytest.raises(BrokerError) as caught:
        ns.send(q, message())
    assert caught.value.condition == "com.microsoft:timeout"
    ns.restore_fragments()
    ns.send(q, message())
    assert len(q.by_sequence) == 1


def test_fragment_faults_need_a_partitioned_entity_and_a_valid_index(ns: Namespace) -> None:
    ns.create_queue("plain")
    ns.create_queue("q", PARTITIONED)
    with pytest.raises(BrokerError):
        ns.fragment_down("plain", 0)
    with pytest.raises(BrokerError):
        ns.fragment_down("q", PARTITION_COUNT)
    with pytest.raises(BrokerError) as caught:
        ns.fragment_down("nowhere", 0)
    assert caught.value.condition == "amqp:not-found"


def test_receive_holds_messages_of_a_down_fragment_until_it_is_up(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED)
    for i in range(4):
        ns.send(q, message(str(i).encode()))  # fragments 0, 1, 2, 3
    ns.fragment_down("q", 1)
    consumer = FakeConsumer(credit=10)
    q.add_consumer(consumer)
    assert [m.fragment for m in consumer.got] == [0, 2, 3]
    ns.fragment_up("q", 1)
    assert [m.fragment for m in consumer.got] == [0, 2, 3, 1]


def test_topic_fragments_apply_to_every_subscription(ns: Namespace) -> None:
    topic = ns.create_topic("t", PARTITIONED)
    sub = ns.create_subscription("t", "s")
    ns.fragment_down("t", 0)
    with pytest.raises(BrokerError):
        ns.send(topic, message(partition_key=key_in(0)))
    ns.send(topic, message())  # fragment 1: round-robin skips 0
    ns.send(topic, message(partition_key=key_in(2)))
    assert [m.fragment for m in stored(sub)] == [1, 2]
    assert sub.partitioned and sub.dead_letter is not None and sub.dead_letter.partitioned


# -- duplicate detection per fragment ------------------------------------------------------


def test_duplicate_detection_is_per_fragment(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED_DEDUP)
    ns.send(q, message(message_id="m1"))
    ns.send(q, message(message_id="m1"))  # same id, same fragment: dropped
    assert len(q.by_sequence) == 1
    a, b = key_in(1, "a"), key_in(2, "b")
    ns.send(q, message(message_id="m2", partition_key=a))
    ns.send(q, message(message_id="m2", partition_key=b))  # other fragment: not a duplicate
    ns.send(q, message(message_id="m2", partition_key=a))  # same fragment: dropped
    assert [m.fragment for m in stored(q)] == [fragment_of("m1"), 1, 2]


# -- peek ------------------------------------------------------------------------------------


def test_peek_answers_one_fragment_run_at_a_time(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED)
    a, b = key_in(4, "a"), key_in(9, "b")
    for key in (a, a, a, b, b, a):
        ns.send(q, message(partition_key=key))
    first = q.peek(0, 10)
    assert [m.sequence_number for m in first] == [1, 2, 3]
    second = q.peek(first[-1].sequence_number + 1, 10)
    assert [m.sequence_number for m in second] == [4, 5]
    third = q.peek(second[-1].sequence_number + 1, 10)
    assert [m.sequence_number for m in third] == [6]
    assert q.peek(7, 10) == []
    assert [m.sequence_number for m in q.peek(0, 2)] == [1, 2]  # never more than asked


def test_peek_stops_at_256_kb_but_returns_at_least_one(ns: Namespace) -> None:
    q = ns.create_queue("q", PARTITIONED)
    for _ in range(3):
        ns.send(q, message(b"x" * 100_000, partition_key="same"))
    assert len(q.peek(0, 10)) == 2
    assert len(q.peek(3, 10)) == 1


def test_peek_of_a_non_partitioned_entity_is_unchanged(ns: Namespace) -> None:
    q = ns.create_queue("q")
    for key in ("a", "b", "a", "b"):
        ns.send(q, message(partition_key=key))
    assert len(q.peek(0, 10)) == 4


# -- quotas and sizes ------------------------------------------------------------------------


def test_at_most_100_partitioned_entities(ns: Namespace) -> None:
    for i in range(MAX_PARTITIONED_ENTITIES - 1):
        ns.create_queue(f"q{i}", PARTITIONED)
    ns.create_topic("t", PARTITIONED)
    ns.create_queue("plain")  # non-partitioned entities do not count
    for create in (ns.create_queue, ns.create_topic):
        with pytest.raises(BrokerError) as caught:
            create("one-too-many", PARTITIONED)
        assert caught.value.condition == "amqp:resource-limit-exceeded"
    ns.delete("q0")
    ns.create_queue("again", PARTITIONED)


@pytest.mark.parametrize("size", [1024, 2048, 3072, 4096, 5120])
def test_partitioned_sizes_of_1_to_5_gb_are_allowed(ns: Namespace, size: int) -> None:
    ns.create_queue("q", EntityProperties(enable_partitioning=True, max_size_in_megabytes=size))


@pytest.mark.parametrize("size", [512, 1500, 6144, 16384])
def test_other_partitioned_sizes_are_refused(ns: Namespace, size: int) -> None:
    properties = EntityProperties(enable_partitioning=True, max_size_in_megabytes=size)
    with pytest.raises(BrokerError) as caught:
        ns.create_queue("q", properties)
    assert caught.value.condition == "amqp:invalid-field"
    ns.create_queue("plain", EntityProperties(max_size_in_megabytes=size))  # not partitioned


def test_purge_forgets_held_messages(ns: Namespace) -> None:
    q = ns.create_queue(
        "q",
        PARTITIONED,
    )
    ns.send(q, message())
    ns.fragment_down("q", 0)
    consumer = FakeConsumer(credit=5)
    q.add_consumer(consumer)
    assert consumer.got == []
    ns.purge()
    ns.fragment_up("q", 0)
    assert consumer.got == []
