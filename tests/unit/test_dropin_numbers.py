"""The sequence numbers the drop-in client hands out name their region and round-trip."""

from __future__ import annotations

import random

from georep.servicebus.aio._numbers import (
    SECONDARY_MARK,
    handed_out,
    mark,
    own_number,
    region_of,
)
from georep.testing import FakeReceivedMessage


def test_a_number_names_its_region_and_its_own_number_at_random() -> None:
    draw = random.Random(20261126)
    for _ in range(1000):
        # Partitioned entities put the partition id in the top 16 bits (at most 32 used).
        own = draw.randrange(1 << 48) | (draw.randrange(32) << 48)
        region = draw.choice(["primary", "secondary"])
        number = handed_out(region, own)
        assert 0 < number < 1 << 63, "a positive 64-bit integer, as the SDK's"
        assert region_of(number) == region
        assert own_number(number) == own


def test_one_number_in_both_regions_is_handed_out_as_two() -> None:
    assert handed_out("primary", 22) == 22
    assert handed_out("secondary", 22) == 22 | SECONDARY_MARK


def test_marking_a_message_shows_its_handed_out_number_once() -> None:
    message = FakeReceivedMessage(b"x", "id-1", sequence_number=22)
    mark(message, "secondary")
    mark(message, "secondary")
    assert message.sequence_number == 22 | SECONDARY_MARK
    primary = FakeReceivedMessage(b"y", "id-2", sequence_number=22)
    assert mark(primary, "primary").sequence_number == 22
