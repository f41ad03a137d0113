"""The drop-in async client (``georep.servicebus.aio.ServiceBusClient``) runs programs
written for azure-servicebus unchanged but for the line that makes the client.

Each program in ``samples/`` runs on the raw SDK against one emulated namespace, then with
georep's client over two emulated regions (active replication, a Redis seen-set): it prints
the same, and leaves in each region what the raw run left in its one. Then again with the
primary region taken down partway through: it finishes with the same output, and once the
primary is back, nothing the program completed is handed out again (a receiver on the same
seen-set gets nothing) and nothing is left that the raw run did not leave.
"""

from __future__ import annotations

import asyncio
from types import ModuleType

import pytest
from _dropin import (
    REGIONS,
    SAMPLES,
    Left,
    Names,
    Outage,
    capture_async,
    handed_out_again,
    leftovers,
    make_names,
    nothing,
    sample_id,
)
from _helpers import eventually, fault
from azure.servicebus.aio import ServiceBusClient as SdkClient

from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

pytestmark = pytest.mark.integration

_RUN_SECONDS = 120


@pytest.fixture(scope="module")
def raw_runs() -> dict[str, tuple[list[str], Left]]:
    """Each sample's output and leftovers on the raw SDK, run once per module."""
    return {}


async def raw_run(
    emu: Emulator, sample: ModuleType, cache: dict[str, tuple[list[str], Left]]
) -> tuple[list[str], Left]:
    key = sample_id(sample)
    if key not in cache:
        names = make_names(emu, ["primary"])
        client = SdkClient.from_connection_string(emu.connection_string("primary"))
        output = await asyncio.wait_for(
            capture_async(lambda: sample.run_async(client, names, nothing)), _RUN_SECONDS
        )
        assert output, f"{key} printed nothing on the raw SDK"
        cache[key] = (output, leftovers(emu, "primary", names))
    return cache[key]


def georep_client(emu: Emulator, seen: RedisSeenSet) -> ServiceBusClient:
    """The one changed line."""
    return ServiceBusClient.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        seen=seen,
        mode=ReplicationMode.ACTIVE,
    )


async def all_left_as(emu: Emulator, names: Names, expected: Left) -> bool:
    """Whether every region holds what the raw run left (twins may still be settling)."""

    def matches() -> bool:
        return all(leftovers(emu, region, names) == expected for region in REGIONS)

    return await eventually(matches, within=20)


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
async def test_a_program_prints_the_same_over_two_regions(
    emu: Emulator,
    sample: ModuleType,
    seen: RedisSeenSet,
    raw_runs: dict[str, tuple[list[str], Left]],
) -> None:
    expected, raw_left = await raw_run(emu, sample, raw_runs)
    names = make_names(emu, REGIONS)
    client = georep_client(emu, seen)

    output = await asyncio.wait_for(
        capture_async(lambda: sample.run_async(client, names, nothing)), _RUN_SECONDS
    )

    assert output == expected
    assert await all_left_as(emu, names, raw_left), {
        region: leftovers(emu, region, names) for region in REGIONS
    }


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
async def test_a_program_finishes_through_a_primary_outage(
    emu: Emulator,
    sample: ModuleType,
    seen: RedisSeenSet,
    raw_runs: dict[str, tuple[list[str], Left]],
) -> None:
    expected, raw_left = await raw_run(emu, sample, raw_runs)
    names = make_names(emu, REGIONS)
    client = georep_client(emu, seen)
    outage = Outage(emu)

    try:
        output = await asyncio.wait_for(
            capture_async(lambda: sample.run_async(client, names, outage)), _RUN_SECONDS
        )
    finally:
        await fault(emu, "primary", "restore")

    assert outage.started is not None, "the program never reached its checkpoint"
    assert output == expected
    assert await handed_out_again(emu, names, seen, until=outage.locks_lapsed_by()) == []
    assert await all_left_as(emu, names, raw_left), {
        region: leftovers(emu, region, names) for region in REGIONS
    }
