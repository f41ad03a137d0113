"""georep.sync over georep.testing's in-memory regions: blocking calls, errors, lifecycle."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

import georep.sync
from georep import AllRegionsUnavailableError, ClosedError, ConfigurationError, SendResult
from georep._sync_runtime import RUNTIME
from georep.ports import ErrorKind
from georep.testing import (
    FakeClock,
    FakeMessage,
    InMemoryOutbox,
    InMemoryRegionReceiver,
    InMemoryRegionSender,
    InMemorySeenSet,
)


def loop_threads() -> list[threading.Thread]:
    gc.collect()  # a closed blocking drop-in client holds the loop until it is collected
    return [t for t in threading.enumerate() if t.name == "georep-sync-loop"]


@pytest.fixture
def regions() -> Iterator[tuple[InMemoryRegionSender, InMemoryRegionSender]]:
    yield InMemoryRegionSender("primary"), InMemoryRegionSender("secondary")
    gc.collect()  # a closed blocking drop-in client holds the loop until it is collected
    assert RUNTIME.thread is None, "a test left a georep.sync object open"


def test_send_blocks_and_returns_the_cores_send_result(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    primary, secondary = regions
    with georep.sync.GeoSender(primary, secondary, mode="active") as sender:
        result = sender.send_messages(FakeMessage(b"hello"))
        assert isinstance(result, SendResult)
        assert set(result.accepted) == {"primary", "secondary"}
        assert (
            [m.body for m in primary.accepted] == [b"hello"] == [m.body for m in secondary.accepted]
        )
        assert sender.stats.accepted == {"primary": 1, "secondary": 1}


def test_errors_are_georeps_not_concurrent_futures(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    primary, secondary = regions
    primary.fail_with(ErrorKind.CONNECTION)
    secondary.fail_with(ErrorKind.CONNECTION)
    with georep.sync.GeoSender(primary, secondary) as sender:
        with pytest.raises(AllRegionsUnavailableError) as caught:
            sender.send_messages(FakeMessage(b"lost?"))
        assert set(caught.value.causes) == {"primary", "secondary"}


def test_bad_configuration_raises_at_construction_and_leaves_no_thread(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    primary, _ = regions
    with pytest.raises(ConfigurationError, match="same namespace"):
        georep.sync.GeoSender(primary, InMemoryRegionSender("other", primary.namespace))
    assert not loop_threads()


def test_close_is_idempotent_and_use_after_close_raises_closed_error(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    sender = georep.sync.GeoSender(*regions)
    sender.send_messages(FakeMessage(b"m"))
    sender.close()
    sender.close()
    for call in (
        lambda: sender.send_messages(FakeMessage(b"m")),
        sender.create_message_batch,
        sender.drain_outbox,
    ):
        with pytest.raises(ClosedError):
            call()
    assert not loop_threads()


def test_one_loop_thread_serves_every_open_object_and_stops_with_the_last(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    first = georep.sync.GeoSender(*regions)
    second = georep.sync.GeoSender(
        InMemoryRegionSender("primary", "a.example"), InMemoryRegionSender("secondary", "b.example")
    )
    assert len(loop_threads()) == 1
    first.close()
    assert len(loop_threads()) == 1, "the second sender still needs the loop"
    second.send_messages(FakeMessage(b"still works"))
    second.close()
    assert not loop_threads()


def test_senders_on_one_pair_share_their_roles_as_in_one_event_loop(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    primary, secondary = regions
    primary.fail_with(ErrorKind.CONNECTION)
    with (
        georep.sync.GeoSender(primary, secondary) as first,
        georep.sync.GeoSender(primary, secondary) as second,
    ):
        assert first.send_messages(FakeMessage(b"a")).failed_over
        assert second.active_region == "secondary"


def test_an_outbox_handed_over_is_closed_by_the_last_object_using_it(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    outbox = InMemoryOutbox()
    first = georep.sync.GeoSender(*regions, outbox=outbox)
    second = georep.sync.GeoSender(*regions, outbox=outbox)
    first.close()
    assert not outbox._closed
    second.close()
    assert outbox._closed


def test_a_sync_method_called_on_georeps_loop_thread_raises_instead_of_deadlocking(
    regions: tuple[InMemoryRegionSender, InMemoryRegionSender],
) -> None:
    import asyncio

    with georep.sync.GeoSender(*regions) as sender:

        async def from_async_code() -> None:
            sender.send_messages(FakeMessage(b"m"))

        future = asyncio.run_coroutine_threadsafe(from_async_code(), RUNTIME.loop)
        with pytest.raises(RuntimeError, match="use the async API"):
            future.result(timeout=5)


def test_a_sync_receiver_handler_is_still_callable() -> None:
    calls: list[object] = []

    @georep.sync.receiver(primary="a", secondary="b", queue_name="orders", seen=object())
    def handle(message: object) -> None:
        calls.append(message)

    handle("m")
    assert calls == ["m"] and handle.__name__ == "handle"
    assert handle.stats.processed == 0
    handle.close()
    with pytest.raises(ClosedError):
        handle.run()


def test_the_loop_thread_ends_when_a_leftover_task_swallows_its_cancellation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The loop's shutdown gathered the cancelled leftovers without a bound: one that
    swallows its cancellation kept georep's loop thread alive for ever."""
    import asyncio

    from georep import _sync_runtime

    monkeypatch.setattr(_sync_runtime, "_STOP_SECONDS", 0.0, raising=False)  # no waiting
    monkeypatch.setattr(_sync_runtime, "_JOIN_SECONDS", 5.0)  # a hang limit only
    runtime = _sync_runtime.LoopRuntime()
    runtime.acquire()
    let_go = threading.Event()
    started = threading.Event()

    async def stubborn() -> None:
        started.set()
        while not let_go.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue

    runtime.submit(stubborn())
    assert started.wait(5)
    thread = runtime.thread
    assert thread is not None
    runtime.release()
    try:
        assert not thread.is_alive(), "the loop thread stopped"
        assert "did not end within 0 s of being cancelled" in caplog.text
    finally:
        let_go.set()
        thread.join(5)


def test_a_blocking_receiver_refuses_an_async_handler_before_receiving_anything() -> None:
    """``georep.sync.GeoReceiver.run`` calls its handler on a worker thread and takes its
    return as "processed": given an ``async def``, that return was a coroutine never run,
    and every message was completed unprocessed. Now refused at once, naming the fix."""
    clock = FakeClock()
    primary = InMemoryRegionReceiver("primary", clock=clock)
    secondary = InMemoryRegionReceiver("secondary", clock=clock)
    primary.put(FakeMessage(b"x", "m1"))

    async def handle(message: object) -> None:
        raise AssertionError("never called")

    class Handler:
        async def __call__(self, message: object) -> None:
            raise AssertionError("never called")

    receiver = georep.sync.GeoReceiver(primary, secondary, seen=InMemorySeenSet(clock=clock))
    try:
        for handler in (handle, Handler()):
            with pytest.raises(ConfigurationError, match=r"async def.*georep\.GeoReceiver"):
                receiver.run(handler)  # type: ignore[arg-type]
    finally:
        receiver.close()
    assert primary.pending == 1 and not primary.completed, "nothing was received or settled"
