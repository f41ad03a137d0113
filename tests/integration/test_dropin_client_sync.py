"""The drop-in blocking client (``georep.servicebus.ServiceBusClient``) runs sync programs
written for azure-servicebus unchanged but for the line that makes the client.

As ``test_dropin_client.py``, with each program's sync version (``run``): the same output on
the raw SDK against one namespace and on georep's client over two regions, the same
leftovers, and through a primary outage taken partway, nothing completed handed out again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from _dropin import (
    REGIONS,
    SAMPLES,
    Left,
    Names,
    Outage,
    capture,
    handed_out_again,
    leftovers,
    make_names,
    nothing_sync,
    sample_id,
)
from _helpers import REDIS_URL
from azure.servicebus import ServiceBusClient as SdkClient, ServiceBusMessage

from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus import ServiceBusClient

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def raw_runs() -> dict[str, tuple[list[str], Left]]:
    """Each sample's output and leftovers on the raw sync SDK, run once per module."""
    return {}


def raw_run(
    emu: Emulator, sample: ModuleType, cache: dict[str, tuple[list[str], Left]]
) -> tuple[list[str], Left]:
    key = sample_id(sample)
    if key not in cache:
        names = make_names(emu, ["primary"])
        client = SdkClient.from_connection_string(emu.connection_string("primary"))
        output = capture(lambda: sample.run(client, names, nothing_sync))
        assert output, f"{key} printed nothing on the raw SDK"
        cache[key] = (output, leftovers(emu, "primary", names))
    return cache[key]


@pytest.fixture
def group() -> str:
    """A seen-set group of the test's own (each client gets its own RedisSeenSet on it,
    closed with the sync client object)."""
    return f"dropin-sync-{uuid.uuid4().hex[:8]}"


def georep_client(emu: Emulator, group: str) -> ServiceBusClient:
    """The one changed line."""
    return ServiceBusClient.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        seen=RedisSeenSet(REDIS_URL, group=group, window=600),
        mode=ReplicationMode.ACTIVE,
    )


def wait_until(condition: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polling the emulator's counts, which georep's loop changes
    return True


def all_left_as(emu: Emulator, names: Names, expected: Left) -> bool:
    return wait_until(
        lambda: all(leftovers(emu, region, names) == expected for region in REGIONS), within=20
    )


async def handed_out_again_on(emu: Emulator, names: Names, group: str, outage: Outage) -> list[str]:
    """:func:`handed_out_again` through the async client on the test's seen-set group
    (what a completed message left behind is in the regions and the seen-set, whichever
    client looks)."""
    seen = RedisSeenSet(REDIS_URL, group=group, window=600)
    try:
        return await handed_out_again(emu, names, seen, until=outage.locks_lapsed_by())
    finally:
        await seen.aclose()


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
def test_a_sync_program_prints_the_same_over_two_regions(
    emu: Emulator,
    sample: ModuleType,
    group: str,
    raw_runs: dict[str, tuple[list[str], Left]],
) -> None:
    expected, raw_left = raw_run(emu, sample, raw_runs)
    names = make_names(emu, REGIONS)

    output = capture(lambda: sample.run(georep_client(emu, group), names, nothing_sync))

    assert output == expected
    assert all_left_as(emu, names, raw_left), {
        region: leftovers(emu, region, names) for region in REGIONS
    }


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
def test_a_sync_program_finishes_through_a_primary_outage(
    emu: Emulator,
    sample: ModuleType,
    group: str,
    raw_runs: dict[str, tuple[list[str], Left]],
) -> None:
    expected, raw_left = raw_run(emu, sample, raw_runs)
    names = make_names(emu, REGIONS)
    outage = Outage(emu)

    try:
        output = capture(lambda: sample.run(georep_client(emu, group), names, outage.sync))
    finally:
        emu.namespace("primary").restore()

    assert outage.started is not None, "the program never reached its checkpoint"
    assert output == expected
    assert asyncio.run(handed_out_again_on(emu, names, group, outage)) == []
    assert all_left_as(emu, names, raw_left), {
        region: leftovers(emu, region, names) for region in REGIONS
    }


def reuse_program(client: Any, queue: str) -> list[str]:
    """A blocking program that uses its client again after the client's with-block and
    after ``close()``, as the SDK's blocking client allows."""
    out: list[str] = []

    def send(body: str) -> None:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(body))

    def receive() -> None:
        with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            for message in receiver.receive_messages(max_message_count=1, max_wait_time=5):
                out.append(str(message))
                receiver.complete_message(message)

    with client:
        send("one")
    with client:  # again, after the with-block closed it
        receive()
    client.close()
    send("two")  # and without one, after close()
    receive()
    client.close()
    return out


def test_a_blocking_client_is_used_again_after_close_as_the_sdks(emu: Emulator, group: str) -> None:
    names = make_names(emu, REGIONS)
    raw = reuse_program(
        SdkClient.from_connection_string(emu.connection_string("primary")), names.queue
    )
    assert raw == ["one", "two"]
    assert reuse_program(georep_client(emu, group), names.queue) == raw
    empty = {region: (0, 0, 0) for region in REGIONS}
    assert wait_until(
        lambda: {r: leftovers(emu, r, names)["QUEUE"] for r in REGIONS} == empty, within=20
    ), {region: leftovers(emu, region, names) for region in REGIONS}
