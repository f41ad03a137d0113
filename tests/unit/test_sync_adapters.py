"""The sync SDK adapters' worker thread, and the factory that picks an adapter.

The SDK objects here are stand-ins with the sync sender's shape that block on events the
test controls; the real SDK against the emulator is in tests/integration/test_sync_sdk.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from georep.adapters.servicebus import (
    ServiceBusRegionReceiver,
    ServiceBusRegionSender,
    SyncServiceBusRegionReceiver,
    SyncServiceBusRegionSender,
    region_receiver_for,
    region_sender_for,
)
from georep.adapters.servicebus._sync import RegionWorker
from georep.exceptions import ClosedError, ConfigurationError, RegionUnavailableError
from georep.ports import ErrorKind
from georep.testing import FakeClock, InMemoryRegionSender

CONN = "Endpoint=sb://unit.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0"


class BlockingSdkSender:
    """A sync SDK sender stand-in: each send records its message once ``gate`` opens."""

    fully_qualified_namespace = "unit.servicebus.windows.net"
    entity_name = "orders"

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.threads: set[str] = set()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: Exception | None = None

    def send_messages(self, messages: Any, *, timeout: float) -> None:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append(messages)


async def test_calls_run_in_order_on_one_named_thread_off_the_loop() -> None:
    sdk = BlockingSdkSender()
    adapter = SyncServiceBusRegionSender(sdk, region="primary")  # type: ignore[arg-type]
    await asyncio.gather(*(adapter.send(f"m{i}", timeout=5) for i in range(20)))
    assert sdk.sent == [f"m{i}" for i in range(20)]
    assert sdk.threads == {"georep-sb-primary-orders"}
    assert threading.current_thread().name not in sdk.threads
    await adapter.close()
    with pytest.raises(ClosedError):
        await adapter.send("late", timeout=5)


async def test_a_call_whose_deadline_passed_before_it_started_is_never_run() -> None:
    """A stuck SDK call keeps the worker: later calls fail at their own deadline, and run
    neither concurrently with it nor late, after the core counted them as failed."""
    clock = FakeClock()
    sdk = BlockingSdkSender()
    sdk.gate.clear()
    adapter = SyncServiceBusRegionSender(sdk, region="primary")  # type: ignore[arg-type]

    async def bounded(message: str) -> None:
        with clock.deadline(2.0):
            await adapter.send(message, timeout=2.0)

    stuck = asyncio.ensure_future(bounded("stuck"))
    await asyncio.to_thread(sdk.entered.wait)
    behind = asyncio.ensure_future(bounded("behind"))
    await clock.advance(2.0)
    for task in (stuck, behind):
        with pytest.raises(TimeoutError):
            await task

    sdk.gate.set()  # the SDK lets go of the stuck call
    await adapter.send("after", timeout=2.0)
    assert sdk.sent == ["stuck", "after"], "the call given up on before it started never ran"
    await adapter.close()


async def test_sdk_errors_are_translated_with_the_region() -> None:
    from azure.servicebus.exceptions import ServiceBusConnectionError

    sdk = BlockingSdkSender()
    sdk.fail_with = ServiceBusConnectionError(message="refused")
    adapter = SyncServiceBusRegionSender(sdk, region="secondary")  # type: ignore[arg-type]
    with pytest.raises(RegionUnavailableError) as caught:
        await adapter.send("m", timeout=1)
    assert caught.value.kind is ErrorKind.CONNECTION and caught.value.region == "secondary"
    assert isinstance(caught.value.__cause__, ServiceBusConnectionError)
    await adapter.close()


async def test_wrappers_of_one_sdk_object_share_its_worker_and_the_last_close_joins_it() -> None:
    sdk = BlockingSdkSender()
    first = SyncServiceBusRegionSender(sdk, region="primary")  # type: ignore[arg-type]
    second = SyncServiceBusRegionSender(sdk, region="primary")  # type: ignore[arg-type]
    assert first.worker is second.worker and first.slot() is second.slot()
    await first.send("a", timeout=1)
    thread = first.worker.thread
    assert thread is not None and thread.is_alive()
    await first.close()
    assert thread.is_alive(), "the other wrapper still uses the worker"
    await second.send("b", timeout=1)
    await second.close()
    assert not thread.is_alive()


def test_an_idle_worker_thread_exits_and_the_next_call_starts_another() -> None:
    worker = RegionWorker("georep-test-idle", idle_exit=0.01)
    assert worker.submit(lambda: 1).result(timeout=5) == 1
    first = worker.thread
    assert first is not None
    first.join(timeout=5)
    assert not first.is_alive() and worker.thread is None
    assert worker.submit(lambda: 2).result(timeout=5) == 2
    assert worker.stop()


def test_stop_finishes_queued_calls_before_the_thread_exits() -> None:
    worker = RegionWorker("georep-test-stop")
    gate = threading.Event()
    done: list[int] = []
    futures = [worker.submit(gate.wait)] + [
        worker.submit(lambda i=i: done.append(i)) for i in range(3)
    ]
    thread = worker.thread
    assert thread is not None
    # Stop while the first call still blocks the thread and three wait behind it; release
    # the gate only once stop() has asked the thread to exit.
    stopping = threading.Thread(target=lambda: stopped.append(worker.stop(timeout=5)))
    stopped: list[bool] = []
    stopping.start()
    for _ in range(1_000_000):  # until stop() has queued its exit behind the 3 calls
        if worker._jobs.qsize() == 4:
            break
        time.sleep(0)  # yield to the stopping thread; no wall-clock wait
    assert worker._jobs.qsize() == 4
    assert not futures[1].done(), "nothing ran past the blocked call yet"
    gate.set()
    stopping.join(timeout=10)
    assert stopped == [True] and not thread.is_alive()
    assert [f.done() for f in futures] == [True] * 4 and done == [0, 1, 2]


def test_the_factory_picks_the_adapter_by_sdk_flavour() -> None:
    sync_client = ServiceBusClient.from_connection_string(CONN)
    async_client = AsyncServiceBusClient.from_connection_string(CONN)
    sync_sender = sync_client.get_queue_sender("orders")
    async_sender = async_client.get_queue_sender("orders")
    assert type(region_sender_for(sync_sender, region="primary")) is SyncServiceBusRegionSender
    assert type(region_sender_for(async_sender, region="primary")) is ServiceBusRegionSender
    sync_receiver = sync_client.get_queue_receiver("orders")
    async_receiver = async_client.get_queue_receiver("orders")
    assert (
        type(region_receiver_for(sync_receiver, region="primary")) is SyncServiceBusRegionReceiver
    )
    assert type(region_receiver_for(async_receiver, region="primary")) is ServiceBusRegionReceiver
    fake = InMemoryRegionSender("primary")
    assert region_sender_for(fake, region="primary") is fake


@pytest.mark.parametrize("factory", [region_sender_for, region_receiver_for])
def test_the_factory_refuses_what_is_not_an_sdk_object(factory: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"the primary \w+ is a dict: pass an azure"):
        factory({}, region="primary")


def test_the_geosender_wraps_a_sync_sdk_sender_in_the_sync_adapter() -> None:
    from georep import GeoSender

    client = ServiceBusClient.from_connection_string(CONN)
    other = ServiceBusClient.from_connection_string(CONN.replace("unit.", "other."))
    sender = GeoSender(client.get_queue_sender("orders"), other.get_queue_sender("orders"))
    assert isinstance(sender._primary, SyncServiceBusRegionSender)
