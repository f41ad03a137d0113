"""Scheduled messages cancelled from another sender, process or restart: the numbers
``schedule_messages`` returns round-trip through a shared :class:`georep.ports.ScheduleStore`
(active mode) or by themselves (one region scheduled them)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from _senders import geo, regions

from georep import ErrorKind, StoreUnavailableError
from georep.ports import ScheduleStore
from georep.send.schedule import SECONDARY_FLAG, ScheduleBook
from georep.testing import FakeClock, FakeMessage, InMemorySeenSet

WHEN = datetime(2030, 1, 1, tzinfo=UTC)


def test_the_seen_sets_are_schedule_stores() -> None:
    from georep.adapters.redis import RedisSeenSet

    assert isinstance(InMemorySeenSet(), ScheduleStore)
    assert isinstance(RedisSeenSet("redis://127.0.0.1:1"), ScheduleStore)


async def test_another_sender_sharing_the_store_cancels_both_regions_copies() -> None:
    primary, secondary = regions()
    store = InMemorySeenSet()
    secondary.scheduled[99] = FakeMessage(b"offset")  # the regions' numbers differ
    first = geo(primary, secondary, mode="active", schedules=store)
    numbers = await first.schedule_messages([FakeMessage(b"a"), FakeMessage(b"b")], WHEN)
    assert numbers == list(primary.scheduled)

    second = geo(primary, secondary, mode="active", schedules=store)  # another process
    await second.cancel_scheduled_messages(numbers)
    assert primary.scheduled == {} and list(secondary.scheduled) == [99]
    assert await store.find_schedules(first.channel, numbers) == [None, None], "forgotten"


async def test_without_a_store_another_sender_cancels_the_primarys_copy_only() -> None:
    primary, secondary = regions()
    numbers = await geo(primary, secondary, mode="active").schedule_messages(
        FakeMessage(b"a"), WHEN
    )
    await geo(primary, secondary, mode="active").cancel_scheduled_messages(numbers)
    assert primary.scheduled == {} and len(secondary.scheduled) == 1


async def test_a_store_down_at_schedule_time_leaves_the_mapping_in_the_senders_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, secondary = regions()
    store = InMemorySeenSet()
    sender = geo(primary, secondary, mode="active", schedules=store)
    store.unavailable = True
    with caplog.at_level(logging.WARNING, "georep.sender"):
        numbers = await sender.schedule_messages(FakeMessage(b"a"), WHEN)
    assert "only this sender can cancel" in caplog.text
    await sender.cancel_scheduled_messages(numbers)  # its memory: no store needed
    assert primary.scheduled == {} and secondary.scheduled == {}


async def test_a_store_down_at_cancel_time_raises_and_cancels_nothing() -> None:
    primary, secondary = regions()
    store = InMemorySeenSet()
    numbers = await geo(primary, secondary, mode="active", schedules=store).schedule_messages(
        FakeMessage(b"a"), WHEN
    )
    store.unavailable = True
    with pytest.raises(StoreUnavailableError):
        await geo(primary, secondary, schedules=store).cancel_scheduled_messages(numbers)
    assert len(primary.scheduled) == 1 and len(secondary.scheduled) == 1
    store.unavailable = False
    await geo(primary, secondary, schedules=store).cancel_scheduled_messages(numbers)
    assert primary.scheduled == {} and secondary.scheduled == {}


async def test_active_mode_with_the_primary_down_returns_flagged_secondary_numbers() -> None:
    primary, secondary = regions()
    store = InMemorySeenSet()
    primary.fail_with(ErrorKind.CONNECTION)
    numbers = await geo(primary, secondary, mode="active", schedules=store).schedule_messages(
        FakeMessage(b"a"), WHEN
    )
    assert numbers == [n | SECONDARY_FLAG for n in secondary.scheduled]
    primary.restore()
    await geo(primary, secondary).cancel_scheduled_messages(numbers)
    assert secondary.scheduled == {}


async def test_the_stored_entries_expire_after_the_schedule_time_and_grace() -> None:
    clock = FakeClock(start=1000.0)
    store = InMemorySeenSet(clock=clock)
    book = ScheduleBook({"primary": "east", "secondary": "west"}, store=store, scope="s", grace=10)
    due = clock.time() + 5
    assert await book.remember({"primary": [3], "secondary": [8]}, due) == [3]
    other = ScheduleBook({"primary": "east", "secondary": "west"}, store=store, scope="s")
    assert await other.resolve([3]) == {"primary": [3], "secondary": [8]}
    await clock.advance(16)
    assert await other.resolve([3]) == {"primary": [3]}, "expired: the primary's copy only"


async def test_the_memory_is_bounded_oldest_schedule_time_first() -> None:
    book = ScheduleBook(limit=2)
    await book.remember({"primary": [1], "secondary": [11]}, 300)
    await book.remember({"primary": [2], "secondary": [12]}, 100)
    await book.remember({"primary": [3], "secondary": [13]}, 200)
    assert len(book) == 2
    assert await book.resolve([1, 2, 3]) == {"primary": [1, 2, 3], "secondary": [11, 13]}
