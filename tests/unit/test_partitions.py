"""Client-side rules for partitioned entities, and peek_all's loop over short answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from georep import ConfigurationError, FailoverPolicy, GeoReceiver, GeoSender, InvalidMessageError
from georep.adapters.servicebus import ServiceBusCodec
from georep.receive.peek import peek_all
from georep.testing import (
    FakeClock,
    FakeMessage,
    InMemoryRegionReceiver,
    InMemoryRegionSender,
    InMemorySeenSet,
)


def test_session_and_partition_key_must_agree() -> None:
    codec = ServiceBusCodec()
    message = ServiceBusMessage("x", partition_key="p1")
    message.session_id = "s1"  # the SDK checks only when partition_key is set second
    with pytest.raises(InvalidMessageError, match=r"session_id 's1'.*partition_key 'p1'"):
        codec.check([message], one_partition=False)
    codec.check([ServiceBusMessage("x", session_id="s", partition_key="s")], one_partition=True)


def test_a_batch_for_a_partitioned_entity_uses_one_key() -> None:
    codec = ServiceBusCodec()
    mixed = [ServiceBusMessage("a", partition_key="k1"), ServiceBusMessage("b", session_id="k2")]
    with pytest.raises(InvalidMessageError, match="one partition key"):
        codec.check(mixed, one_partition=True)
    codec.check(mixed, one_partition=False)  # a non-partitioned entity ignores the key
    same = [ServiceBusMessage("a", partition_key="k"), ServiceBusMessage("b")]
    codec.check(same, one_partition=True)


def test_a_short_deadline_on_a_partitioned_entity_warns() -> None:
    regions = (InMemoryRegionSender("primary", "e"), InMemoryRegionSender("secondary", "w"))
    with pytest.warns(UserWarning, match="15 s"):
        GeoSender(*regions, partitioned=True, policy=FailoverPolicy(attempt_timeout=5))
    GeoSender(*regions, partitioned=True, policy=FailoverPolicy(attempt_timeout=20))


@dataclass
class Peeked:
    sequence_number: int


class ShortAnswers:
    """A receiver whose peeks stop at every 4th sequence number (like fragments)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.calls = 0

    async def peek_messages(
        self, max_message_count: int, *, sequence_number: int, timeout: Any = None
    ) -> list[Peeked]:
        self.calls += 1
        end = min(self.total, sequence_number + max_message_count - 1)
        end = min(end, (sequence_number - 1) // 4 * 4 + 4)  # the end of this "fragment"
        return [Peeked(n) for n in range(sequence_number, end + 1)]


async def test_peek_all_loops_past_short_answers_until_count() -> None:
    receiver = ShortAnswers(total=30)
    peeked = await peek_all(receiver, 10)
    assert [p.sequence_number for p in peeked] == list(range(1, 11))
    assert receiver.calls == 3


async def test_peek_all_stops_when_the_entity_is_exhausted() -> None:
    receiver = ShortAnswers(total=6)
    assert [p.sequence_number for p in await peek_all(receiver, 50)] == list(range(1, 7))
    with pytest.raises(ConfigurationError, match="count"):
        await peek_all(receiver, 0)


async def test_geo_receiver_peeks_both_regions() -> None:
    clock = FakeClock()
    primary = InMemoryRegionReceiver("primary", "e", clock=clock)
    secondary = InMemoryRegionReceiver("secondary", "w", clock=clock)
    for index in range(3):
        primary.put(FakeMessage(b"x", f"p{index}"))
    secondary.put(FakeMessage(b"x", "s0"))
    geo = GeoReceiver(primary, secondary, seen=InMemorySeenSet(clock=clock), clock=clock)
    peeked = await geo.peek_all(2)
    assert [m.message_id for m in peeked["primary"]] == ["p0", "p1"]
    assert [m.message_id for m in peeked["secondary"]] == ["s0"]
    assert primary.pending == 3, "peeking locks and removes nothing"
