"""Receivers that stopped reading after an outage, found running sync receivers through
the matrix (issue 14), pinned down without a broker or real waits.

1. The lock keep-alive waited for forever on a cancellation an SDK call swallowed (the
   core's, so sync and async receivers alike; ``georep.sync.GeoReceiver.
   from_connection_strings`` runs the async SDK on georep's loop thread).
2. A receive stuck inside the SDK on a dropped link: a receiver georep created is replaced,
   a caller's sync receiver fails fast and clearly until the SDK lets go.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from georep import GeoReceiver
from georep.adapters.servicebus import (
    ServiceBusRegionReceiver,
    SyncServiceBusRegionReceiver,
    _receiver as _adapter,
)
from georep.exceptions import RegionError, RegionUnavailableError
from georep.ports import ErrorKind
from georep.testing import FakeClock, FakeMessage, InMemoryRegionReceiver, InMemorySeenSet, settle


class SwallowsCancellation(InMemorySeenSet):
    """A seen-set whose lease renewal swallows a cancellation that races its answer.

    Found with the async SDK, whose every frame read goes through ``asyncio.wait_for``: on
    Python 3.11 a ``wait_for`` whose inner call finished just as its task was cancelled
    returns the result and drops the cancellation. Any awaited dependency can do the
    same (a Redis client, an SDK renewal); the keep-alive must not depend on it.
    """

    swallowed = 0

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        try:
            await self._clock.sleep(0.5)  # the round trip
        except asyncio.CancelledError:
            self.swallowed += 1
        return await super().extend(keys, owner=owner, lease=lease)


async def test_a_renewal_that_swallows_its_cancellation_does_not_stall_the_region() -> None:
    clock = FakeClock()
    seen = SwallowsCancellation(clock=clock)
    # Locks of 2 s: the keep-alive renews every second while a handler runs.
    primary = InMemoryRegionReceiver("primary", "east", clock=clock, lock_duration=2.0)
    secondary = InMemoryRegionReceiver("secondary", "west", clock=clock)
    for message_id in ("a", "b", "c"):
        primary.put(FakeMessage(b"x", message_id))
    processed: list[str] = []

    async def handle(message: Any) -> None:
        # Ends while the keep-alive renews the claim (1.0 s .. 1.5 s).
        await clock.sleep(1.2)
        processed.append(message.message_id)

    receiver = GeoReceiver(
        primary, secondary, seen=seen, concurrency=1, max_wait=1.0, lease=30.0, clock=clock
    )
    running = asyncio.create_task(receiver.run(handle))
    await clock.advance(20)
    try:
        assert seen.swallowed >= 1, "the renewal swallowed the keep-alive's cancellation"
        assert processed == ["a", "b", "c"], "the region went on to the next copies"
        assert primary.pending == 0
    finally:
        closing = asyncio.create_task(receiver.aclose())
        await clock.advance(60)
        await asyncio.wait_for(asyncio.gather(closing, running), 1)


# ------------------------------------------------------------- a receive stuck in the SDK


class StuckSyncReceiver:
    """A sync SDK receiver stand-in whose receive blocks until ``gate`` opens."""

    fully_qualified_namespace = "unit.servicebus.windows.net"
    entity_path = "orders"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()
        self.receives = 0

    def __enter__(self) -> StuckSyncReceiver:
        return self

    def receive_messages(self, max_message_count: int, max_wait_time: float) -> list[str]:
        self.receives += 1
        self.entered.set()
        self.gate.wait(30)
        self.returned.set()
        return ["m"]


async def test_a_stuck_sync_receive_fails_fast_and_clearly_until_the_sdk_returns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_adapter, "STUCK_AFTER", -1.0)  # any receive counts: no real wait
    sdk = StuckSyncReceiver()
    adapter = SyncServiceBusRegionReceiver(sdk, region="primary")  # type: ignore[arg-type]
    try:
        receiving = asyncio.ensure_future(adapter.receive(5, max_wait=0.0))
        assert await asyncio.to_thread(sdk.entered.wait, 10)
        receiving.cancel()  # the core's receive deadline
        with pytest.raises(asyncio.CancelledError):
            await receiving
        assert adapter.stuck
        assert "georep cannot reopen a receiver it did not create" in caplog.text

        # Not queued behind the stuck call: refused at once, saying why.
        with pytest.raises(RegionUnavailableError) as refused:
            await adapter.receive(5, max_wait=0.0)
        assert refused.value.kind is ErrorKind.TIMEOUT
        assert "stuck in receive_messages" in str(refused.value)
        assert sdk.receives == 1

        sdk.gate.set()  # the SDK lets go (its link reopened, or an error surfaced)
        assert await asyncio.to_thread(sdk.returned.wait, 10)
        await asyncio.to_thread(adapter.worker.submit(lambda: None).result, 10)
        assert await adapter.receive(5, max_wait=0.0) == ["m"], "the region is read again"
        assert not adapter.stuck
    finally:
        sdk.gate.set()
        await adapter.close()


class HangingAsyncReceiver:
    """An async SDK receiver stand-in: the first receive never returns, later ones do."""

    fully_qualified_namespace = "unit.servicebus.windows.net"
    entity_path = "orders"

    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.closed = False
        self.completed: list[Any] = []

    async def __aenter__(self) -> HangingAsyncReceiver:
        return self

    async def receive_messages(self, max_message_count: int, max_wait_time: float) -> list[Any]:
        if self.hang:
            await asyncio.Event().wait()
        return [SimpleNamespace(_receiver=self, message_id="m")]

    async def complete_message(self, message: Any) -> None:
        self.completed.append(message)

    async def close(self) -> None:
        self.closed = True


async def test_a_receiver_georep_created_is_replaced_when_a_receive_overran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_adapter, "STUCK_AFTER", -1.0)
    first = HangingAsyncReceiver(hang=True)
    made: list[HangingAsyncReceiver] = []

    def reopen() -> Any:
        made.append(HangingAsyncReceiver(hang=False))
        return made[-1]

    client = SimpleNamespace(close=lambda: asyncio.sleep(0))
    adapter = ServiceBusRegionReceiver(
        first,  # type: ignore[arg-type]
        region="primary",
        client=client,  # type: ignore[arg-type]
        reopen=reopen,
    )
    stale = SimpleNamespace(_receiver=first, message_id="held")
    receiving = asyncio.ensure_future(adapter.receive(5, max_wait=0.0))
    await settle()  # the receive is under way
    receiving.cancel()  # the core's receive deadline
    with pytest.raises(asyncio.CancelledError):
        await receiving

    assert len(made) == 1, "a fresh SDK receiver replaced the one whose link is dead"
    [fresh] = await adapter.receive(5, max_wait=0.0)
    assert fresh._receiver is made[0]
    await adapter.complete(fresh)
    assert made[0].completed == [fresh]
    # A copy held from the discarded link is never settled on the new one.
    with pytest.raises(RegionError) as lost:
        await adapter.complete(stale)
    assert lost.value.kind is ErrorKind.LOCK_LOST
    assert first.completed == [] and made[0].completed == [fresh]
    await adapter.close()
    assert first.closed and made[0].closed


async def test_a_callers_async_receiver_is_never_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_adapter, "STUCK_AFTER", -1.0)
    sdk = HangingAsyncReceiver(hang=True)
    adapter = ServiceBusRegionReceiver(sdk, region="primary")  # type: ignore[arg-type]
    receiving = asyncio.ensure_future(adapter.receive(5, max_wait=0.0))
    await settle()  # the receive is under way
    receiving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await receiving
    sdk.hang = False
    [message] = await adapter.receive(5, max_wait=0.0)
    assert message._receiver is sdk
    await adapter.close()
    assert not sdk.closed, "the caller's receiver stays open"


async def test_close_is_bounded_when_a_discarded_receiver_never_closes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """close() gathered the discarded receivers' closes without a bound: one whose SDK
    close swallows the cancellation of its own timeout hung close() for ever."""
    monkeypatch.setattr(_adapter, "STUCK_AFTER", -1.0)
    monkeypatch.setattr(_adapter, "_DISCARD_CLOSE_SECONDS", 0.0)  # no real waiting
    let_go = asyncio.Event()

    class NeverCloses(HangingAsyncReceiver):
        async def close(self) -> None:
            while not let_go.is_set():
                try:
                    await let_go.wait()
                except asyncio.CancelledError:
                    continue

    first = NeverCloses(hang=True)
    client = SimpleNamespace(close=lambda: asyncio.sleep(0))
    adapter = ServiceBusRegionReceiver(
        first,  # type: ignore[arg-type]
        region="primary",
        client=client,  # type: ignore[arg-type]
        reopen=lambda: HangingAsyncReceiver(hang=False),
    )
    receiving = asyncio.ensure_future(adapter.receive(5, max_wait=0.0))
    await settle()
    receiving.cancel()  # overran: the receiver is discarded, its close never ends
    with pytest.raises(asyncio.CancelledError):
        await receiving
    closing = asyncio.ensure_future(adapter.close())
    await settle()
    assert closing.done()
    assert "1 discarded receiver(s) still closing" in caplog.text
    let_go.set()
    await settle()
