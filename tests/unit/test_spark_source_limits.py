"""The Spark source's driver side without Spark: how a lane fills its turn, which waiting
copies the next micro-batch takes (messages, bytes, one lane), and how completions are
buffered and sent together."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from georep.adapters.spark import _source
from georep.adapters.spark._source import Intake, _Labelled, _Waiting, source_settings
from georep.exceptions import region_error
from georep.ports import ErrorKind

SOURCE = {
    "primaryconnectionstring": "Endpoint=sb://a/;SharedAccessKeyName=k;SharedAccessKey=S",
    "secondaryconnectionstring": "Endpoint=sb://b/;SharedAccessKeyName=k;SharedAccessKey=S",
    "queuename": "orders",
    "seenseturl": "redis://127.0.0.1:6379/0",
}


class Region:
    """A region receiver (georep's port) holding ``count`` messages of ``size`` bytes,
    handing out at most ``burst`` per receive; it records what each receive asked for."""

    region = "primary"
    namespace = "a"
    entity = "orders"

    def __init__(self, count: int, size: int, burst: int = 1_000_000) -> None:
        self.held = [ServiceBusMessage(b"x" * size, message_id=str(i)) for i in range(count)]
        self.burst = burst
        self.asked: list[int] = []
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = False

    async def complete_many(self, messages: list[Any]) -> None:
        self.calls.append(("complete_many", [m.message_id for m in messages]))
        if self.fail:
            raise region_error("link detached", region=self.region, kind=ErrorKind.CONNECTION)

    async def abandon(self, message: Any) -> None:
        self.calls.append(("abandon", [message.message_id]))

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        self.asked.append(max_messages)
        given = self.held[: min(max_messages, self.burst)]
        del self.held[: len(given)]
        return given


async def test_a_turn_fills_to_max_bytes_asking_only_for_what_fits() -> None:
    region = Region(100, size=1000)
    lane = _Labelled(region, max_bytes=5000)
    turn = await lane.receive(1000, max_wait=1)
    # Before any copy is seen a copy may be 256 KB: the first receive asks for one.
    assert region.asked == [1, 4]
    assert [m.message_id for m in turn] == ["0", "1", "2", "3", "4"]
    assert all(m._georep_spark_body == b"x" * 1000 for m in turn)
    assert all(m._georep_spark_region == "primary" for m in turn)
    # The next turn fits its first receive to the bodies seen.
    assert len(await lane.receive(1000, max_wait=1)) == 5
    assert region.asked[2:] == [5]


async def test_a_turn_stops_at_max_messages_whatever_the_bytes() -> None:
    region = Region(100, size=10, burst=7)
    lane = _Labelled(region, max_bytes=1 << 20)
    await lane.receive(1, max_wait=1)
    turn = await lane.receive(20, max_wait=1)
    assert len(turn) == 20 and region.asked[1:] == [20, 13, 6]


async def test_a_turn_fills_for_five_seconds_at_most() -> None:
    now = [0.0]

    class Trickle(Region):
        async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
            now[0] += 1.0  # each receive finds a copy after a second
            return await super().receive(max_messages, max_wait=max_wait)

    region = Trickle(100, size=10, burst=1)
    lane = _Labelled(region, max_bytes=1 << 20, clock=lambda: now[0])
    assert len(await lane.receive(50, max_wait=1)) == 6  # received at 1 s, then 2 s ... 6 s


async def test_an_empty_receive_ends_the_turn_and_keeps_the_size_learnt() -> None:
    region = Region(2, size=100)
    lane = _Labelled(region, max_bytes=1000)
    assert len(await lane.receive(50, max_wait=1)) == 2
    assert region.asked == [1, 9, 8]  # the third found nothing: the turn ended there
    assert await lane.receive(50, max_wait=1) == []
    assert region.asked[-1] == 10  # fitted to the 100-byte bodies seen before


def _intake(tmp_path: Path, **options: str) -> Intake:
    return Intake(source_settings({**SOURCE, "staginglocation": str(tmp_path), **options}))


def _wait(intake: Intake, lane: object, sizes: list[int]) -> None:
    loop = asyncio.get_running_loop()
    for size in sizes:
        key = f"m{len(intake._waiting)}"
        intake._waiting[key] = _Waiting({"body": b"x" * size}, loop.create_future(), lane)


async def test_the_next_batch_takes_the_oldest_copys_lane_within_both_limits(
    tmp_path: Path,
) -> None:
    intake = _intake(tmp_path, maxmessagesperbatch="3", maxbytesperbatch="250")
    a, b = object(), object()
    _wait(intake, a, [100])
    _wait(intake, b, [10, 10])
    _wait(intake, a, [100, 100])
    # Lane a's: the first two fit in 250 bytes, the third would not.
    assert [key for key, _ in intake._take(3)] == ["m0", "m3"]
    assert [key for key, _ in intake._take(1)] == ["m0"]


async def test_a_copy_larger_than_the_byte_limit_is_a_batch_of_its_own(tmp_path: Path) -> None:
    intake = _intake(tmp_path, maxbytesperbatch="50")
    lane = object()
    _wait(intake, lane, [500, 10])
    assert [key for key, _ in intake._take(10)] == ["m0"]


async def test_completions_wait_for_the_next_call_and_go_together() -> None:
    region = Region(10, size=10)
    lane = _Labelled(region, max_bytes=1 << 20)
    copies = await lane.receive(10, max_wait=1)
    for copy in copies[:3]:
        await lane.complete(copy)
    assert region.calls == []  # buffered
    await lane.abandon(copies[3])  # any other call sends them first, in order
    assert region.calls == [("complete_many", ["0", "1", "2"]), ("abandon", ["3"])]
    await lane.complete(copies[4])
    await lane.receive(10, max_wait=1)
    assert region.calls[-1] == ("complete_many", ["4"])


async def test_a_full_buffer_is_sent_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_source, "_SETTLE_BATCH", 4)
    region = Region(10, size=10)
    lane = _Labelled(region, max_bytes=1 << 20)
    for copy in await lane.receive(10, max_wait=1):
        await lane.complete(copy)
    assert [ids for _, ids in region.calls] == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]


async def test_completions_a_region_refused_are_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    region = Region(3, size=10)
    lane = _Labelled(region, max_bytes=1 << 20)
    for copy in await lane.receive(3, max_wait=1):
        await lane.complete(copy)
    region.fail = True
    await lane.flush()
    assert "completing 3 copies in primary failed" in caplog.text
    await lane.flush()  # nothing left to send: the copies come back as duplicates
    assert len(region.calls) == 1
