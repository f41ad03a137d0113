"""Repeated warnings become a state change and summaries (georep._logs)."""

from __future__ import annotations

import logging
import uuid

import pytest

from georep._logs import Throttled
from georep.testing import FakeMessage


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="georep.test")
    return caplog


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_warning_repeated_while_a_region_is_down_is_logged_once_then_summarised(
    records: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = Throttled(logging.getLogger("georep.test"), every=30.0, clock=clock)
    for second in range(0, 45):  # one failed send a second for 45 s
        clock.now = float(second)
        log.warning(("send", "primary"), "send to %s failed", "primary")
    assert lines(records, logging.WARNING) == [
        "send to primary failed",
        "send to primary failed (and 29 more like it in the last 30 s)",
    ]
    assert len(lines(records, logging.DEBUG)) == 43, "each occurrence stays at DEBUG"


def test_kinds_are_throttled_apart(records: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = Throttled(logging.getLogger("georep.test"), clock=clock)
    for _ in range(3):
        log.warning("primary", "primary down")
        log.error("redis", "seen-set unreachable")
    assert lines(records, logging.WARNING) == ["primary down"]
    assert lines(records, logging.ERROR) == ["seen-set unreachable"]


def test_an_ended_condition_says_so_with_its_count_and_its_next_start_is_logged_at_once(
    records: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = Throttled(logging.getLogger("georep.test"), clock=clock)
    for _ in range(5):
        log.warning("redis", "seen-set unreachable")
    log.ended("redis", "seen-set answers again")
    log.ended("redis", "seen-set answers again")  # not logged twice
    log.warning("redis", "seen-set unreachable")
    assert lines(records, logging.INFO) == [
        "seen-set answers again (4 more like it were held back)"
    ]
    assert lines(records, logging.WARNING) == ["seen-set unreachable", "seen-set unreachable"]


async def test_an_active_sender_logs_one_warning_for_a_region_that_fails_every_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 31 #9: one WARNING per message while a region was down (186 lines in one run).
    from _senders import down, geo, regions

    from georep import ReplicationMode

    # An entity of its own: the throttle is per process, and other tests fail 'orders'.
    primary, secondary = regions(f"flood-{uuid.uuid4().hex[:8]}")
    down(primary)
    caplog.set_level(logging.DEBUG, logger="georep")
    async with geo(primary, secondary, mode=ReplicationMode.ACTIVE) as sender:
        for number in range(50):
            result = await sender.send_messages(FakeMessage(f"m{number}".encode()))
            assert result.accepted == ("secondary",)
    failed = [r for r in caplog.records if "send to primary failed" in r.getMessage()]
    assert len(failed) == 50, "each one is still logged, at DEBUG"
    assert [r.levelno for r in failed].count(logging.WARNING) == 1
