"""A session's sends queue behind an earlier message of the session the outbox holds
(docs/sessions.md §5): the rule, its release, a restart, refusals in the drain, cancellation.

In-memory regions and outbox, FakeClock: no network, no real sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from _senders import down, geo, queueing, regions, up

from georep import DrainPolicy, ErrorKind, FailoverPolicy, GeoSender, RegionError
from georep.exceptions import OutboxUnavailableError
from georep.testing import FakeClock, FakeMessage, InMemoryOutbox, InMemoryRegionSender, settle


def message(body: str, session: str | None = "s") -> FakeMessage:
    return FakeMessage(body.encode(), session_id=session)


def bodies(region: InMemoryRegionSender) -> list[str]:
    return [m.body.decode() for m in region.accepted]


async def drained(sender: GeoSender, clock: FakeClock, outbox: InMemoryOutbox) -> None:
    """Drain until the outbox is empty (past every back-off, in fake time)."""
    for _ in range(50):
        await sender.drain_outbox()
        if await outbox.depth() == 0:
            return
        await clock.advance(10)
    raise AssertionError(f"the outbox still holds {await outbox.depth()} entries")


async def queued_during_outage(clock: FakeClock, **kwargs: Any) -> tuple[GeoSender, Any, Any, Any]:
    """A sender whose outbox holds message 1 of session ``s`` (both regions were down);
    both regions are back."""
    sender, outbox, primary, secondary = queueing(clock=clock, **kwargs)
    down(primary, secondary)
    result = await sender.send_messages(message("1"))
    assert result.queued and result.failed
    up(primary, secondary)
    return sender, outbox, primary, secondary


async def test_a_session_held_by_the_outbox_queues_behind_it_until_drained(
    clock: FakeClock,
) -> None:
    sender, outbox, primary, secondary = await queued_during_outage(clock)

    behind = await sender.send_messages(message("2"))
    # Queued without trying a region: both are up, nothing failed.
    assert behind.queued and not behind.failed and behind.accepted == ()
    assert primary.accepted == [] and secondary.accepted == []
    assert await outbox.held_sessions(sender.channel) == {"s"}

    await drained(sender, clock, outbox)
    assert bodies(primary) == ["1", "2"]

    released = await sender.send_messages(message("3"))
    assert released.accepted == ("primary",) and not released.queued
    assert bodies(primary) == ["1", "2", "3"]
    await sender.aclose()


async def test_other_sessions_and_messages_without_one_go_straight_to_the_region(
    clock: FakeClock,
) -> None:
    sender, outbox, primary, _ = await queued_during_outage(clock)

    other = await sender.send_messages(message("t1", session="t"))
    plain = await sender.send_messages(message("p1", session=None))

    assert other.accepted == ("primary",) and plain.accepted == ("primary",)
    assert bodies(primary) == ["t1", "p1"]
    assert await outbox.depth() == 1
    await sender.aclose()


async def test_a_list_with_one_held_session_queues_whole_and_in_order(clock: FakeClock) -> None:
    sender, outbox, primary, _ = await queued_during_outage(clock)

    result = await sender.send_messages([message("t1", session="t"), message("2")])

    assert result.queued and primary.accepted == []
    await drained(sender, clock, outbox)
    assert bodies(primary) == ["1", "t1", "2"]
    # t went through the outbox too, so it was held until drained; now neither is.
    await sender.send_messages([message("t2", session="t"), message("3")])
    assert bodies(primary)[-2:] == ["t2", "3"] and await outbox.depth() == 0
    await sender.aclose()


async def test_active_mode_queues_a_copy_per_region_behind_the_session(clock: FakeClock) -> None:
    sender, outbox, primary, secondary = await queued_during_outage(clock, mode="active")

    behind = await sender.send_messages(message("2"))

    assert behind.queued and not behind.failed
    assert primary.accepted == [] and secondary.accepted == []
    await drained(sender, clock, outbox)
    assert bodies(primary) == ["1", "2"] and bodies(secondary) == ["1", "2"]
    await sender.aclose()


async def test_a_new_sender_on_the_file_sends_behind_what_an_earlier_one_left(
    clock: FakeClock,
) -> None:
    # The restart case: the first sender is gone, its entry of session s is still queued.
    first, outbox, primary, secondary = queueing(clock=clock)
    down(primary, secondary)
    assert (await first.send_messages(message("1"))).queued
    await first.aclose()
    up(primary, secondary)

    second = GeoSender(primary, secondary, outbox=outbox, clock=clock)
    behind = await second.send_messages(message("2"))

    assert behind.queued and primary.accepted == []
    await drained(second, clock, outbox)
    assert bodies(primary) == ["1", "2"]
    await second.aclose()


class RefusesOnce(InMemoryRegionSender):
    """Refuses the message with body ``refuse`` once, for now (quota exceeded)."""

    refuse = b"1"

    async def send(self, messages: Any, *, timeout: float) -> None:
        if any(m.body == self.refuse for m in self.codec.split(messages)):
            await self._check()  # down: raised here, the refusal still to come
            self.refuse = b""
            raise RegionError("full for now", region=self.region, kind=ErrorKind.QUOTA_EXCEEDED)
        await super().send(messages, timeout=timeout)


async def test_a_session_entry_refused_for_now_is_not_overtaken_by_its_successor(
    clock: FakeClock,
) -> None:
    primary = RefusesOnce("primary", "east.example", "orders", clock=clock)
    secondary = InMemoryRegionSender("secondary", "west.example", "orders", clock=clock)
    outbox = InMemoryOutbox()
    sender = GeoSender(primary, secondary, outbox=outbox, clock=clock)
    down(primary, secondary)
    await sender.send_messages(message("1"))
    await sender.send_messages(message("2"))  # queued behind 1
    await sender.send_messages(message("x", session="other"))
    up(primary, secondary)

    await sender.drain_outbox()
    # 1 was refused for now (retried later); 2 waits behind it, the other session goes on.
    assert bodies(primary) == ["x"]
    assert await outbox.depth() == 2
    await drained(sender, clock, outbox)
    assert bodies(primary) == ["x", "1", "2"]
    await sender.aclose()


class PutStoresThenStalls(InMemoryOutbox):
    """A put that stores its entries, then waits (as a put whose commit happened on the
    worker thread while its caller was cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = False
        self.stored = asyncio.Event()

    async def put(self, *args: Any, **kwargs: Any) -> list[int]:  # the port's arguments
        ids = await super().put(*args, **kwargs)
        if self.stall:
            self.stored.set()
            await asyncio.Event().wait()
        return ids


async def test_a_send_cancelled_after_its_entry_was_stored_is_delivered_once_in_order(
    clock: FakeClock,
) -> None:
    outbox = PutStoresThenStalls()
    sender, _, primary, secondary = queueing(outbox, clock=clock)
    down(primary, secondary)
    outbox.stall = True
    sending = asyncio.ensure_future(sender.send_messages(message("1", session="s")))
    await outbox.stored.wait()
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    outbox.stall = False
    up(primary, secondary)

    behind = await sender.send_messages(message("2"))

    assert behind.queued, "the session's next send waits behind the stored entry"
    await drained(sender, clock, outbox)
    assert bodies(primary) == ["1", "2"]
    assert [m.message_id for m in primary.accepted] == list(
        dict.fromkeys(m.message_id for m in primary.accepted)
    ), "each delivered once"
    await sender.aclose()


class UnreadableSessions(InMemoryOutbox):
    async def held_sessions(
        self, channel: str, session_ids: Sequence[str] | None = None
    ) -> set[str]:
        raise OutboxUnavailableError("outbox could not be used just now (injected)")


async def test_an_outbox_that_cannot_be_read_lets_the_send_go_to_the_region_and_says_so(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sender, _, primary, _ = queueing(UnreadableSessions(), clock=clock)

    with caplog.at_level(logging.WARNING, logger="georep.sender"):
        result = await sender.send_messages(message("1"))

    assert result.accepted == ("primary",) and bodies(primary) == ["1"]
    assert "cannot tell whether it holds an earlier message" in caplog.text
    await sender.aclose()


async def test_without_anything_queued_a_session_send_reads_the_outbox_once(
    clock: FakeClock,
) -> None:
    class Counting(InMemoryOutbox):
        reads = 0

        async def held_sessions(
            self, channel: str, session_ids: Sequence[str] | None = None
        ) -> set[str]:
            self.reads += 1
            return await super().held_sessions(channel, session_ids)

    outbox = Counting()
    sender, _, primary, _ = queueing(outbox, clock=clock)
    for n in range(5):
        await sender.send_messages(message(str(n), session=f"s{n % 2}"))
    await settle()

    assert outbox.reads == 1, "what the file held, learned once; no read per send"
    assert len(primary.accepted) == 5
    await sender.aclose()


class SlowOnA0(InMemoryRegionSender):
    """Takes 5 s (of fake time) more over message ``a0``; what any of them accepted goes
    to one log, in order."""

    log: list[str]  # set by the test: one log for every region

    async def send(self, messages: Any, *, timeout: float) -> None:
        if any(m.body == b"a0" for m in self.codec.split(messages)):
            assert self._clock is not None
            await self._clock.sleep(5.0)
        await super().send(messages, timeout=timeout)
        self.log.extend(m.body.decode() for m in self.codec.split(messages))


async def test_two_drainers_on_one_outbox_deliver_each_session_in_order(clock: FakeClock) -> None:
    # Two processes sharing the file (each its own links) drain at once, one entry a
    # claim. Before the claim's session rule, the second took a1 while the first was
    # still sending a0 (slow), and a1 reached the region first.
    outbox = InMemoryOutbox()
    log: list[str] = []
    senders = []
    for _ in range(2):
        primary, secondary = regions(clock=clock, cls=SlowOnA0)
        for region in (primary, secondary):
            region.latency, region.log = 0.5, log
        senders.append(
            geo(primary, secondary, outbox=outbox, clock=clock,
                policy=FailoverPolicy(attempt_timeout=10.0), drain=DrainPolicy(batch_size=1))
        )  # fmt: skip
    first, second = senders
    codec = primary.codec
    messages = [message(f"{s}{n}", session=s) for n in range(6) for s in "ab"]
    await outbox.put(
        first.channel,
        [(None, codec.encode(m)) for m in messages],
        now=clock.time(),
        sessions=[m.session_id for m in messages],
    )

    rounds = [asyncio.ensure_future(first.drain_outbox())]
    await clock.advance(0.25)  # the first is sending a0
    rounds.append(asyncio.ensure_future(second.drain_outbox()))
    while not all(r.done() for r in rounds):
        await clock.advance(0.25)

    await first.drain_outbox()  # what the second left while a0 was leased
    assert await outbox.depth() == 0 and len(log) == 12
    assert all(r.result() for r in rounds), "both drained"
    for session in "ab":
        assert [b for b in log if b.startswith(session)] == [f"{session}{n}" for n in range(6)]
    await first.aclose()
    await second.aclose()
