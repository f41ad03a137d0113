"""The drop-in client's session listing over two regions (``sessions_in_both``), on the
in-memory session queues: each session once, a failed region left out, the SDK's errors
when none lists."""

from __future__ import annotations

import pytest
from azure.servicebus.exceptions import OperationTimeoutError

from georep.exceptions import AllRegionsUnavailableError, AuthenticationError
from georep.ports import ErrorKind
from georep.servicebus.aio._session_list import sessions_in_both
from georep.testing import FakeClock, FakeMessage, InMemoryRegionSessions


def _regions() -> tuple[InMemoryRegionSessions, InMemoryRegionSessions]:
    clock = FakeClock()
    primary = InMemoryRegionSessions("primary", clock=clock)
    secondary = InMemoryRegionSessions("secondary", clock=clock)
    for region, sessions in ((primary, ("b", "both")), (secondary, ("both", "a"))):
        for session in sessions:
            region.put(FakeMessage(b"x", message_id=f"{session}-1", session_id=session))
    return primary, secondary


async def test_each_session_is_listed_once_the_primarys_first() -> None:
    listed = await sessions_in_both(_regions(), state_updated_after=None, timeout=None)
    assert listed == ["b", "both", "a"]


async def test_a_region_that_fails_is_left_out() -> None:
    primary, secondary = _regions()
    primary.fail_with(ErrorKind.CONNECTION)
    listed = await sessions_in_both((primary, secondary), state_updated_after=None, timeout=None)
    assert listed == ["both", "a"]


async def test_both_refusing_raise_the_primarys_refusal_and_none_answering_a_connection_error() -> (
    None
):
    primary, secondary = _regions()
    primary.fail_with(ErrorKind.AUTHENTICATION)
    secondary.fail_with(ErrorKind.AUTHENTICATION)
    with pytest.raises(AuthenticationError) as refused:
        await sessions_in_both((primary, secondary), state_updated_after=None, timeout=None)
    assert refused.value.region == "primary"
    secondary.fail_with(ErrorKind.CONNECTION)  # one down, one refusing: not a refusal
    with pytest.raises(AllRegionsUnavailableError) as unavailable:
        await sessions_in_both((primary, secondary), state_updated_after=None, timeout=None)
    assert set(unavailable.value.causes) == {"primary", "secondary"}


async def test_every_region_out_of_the_given_timeout_is_an_operation_timeout() -> None:
    """Each region's own deadline is the caller's ``timeout`` too: when all of them ran out
    (before the call's own), the call raises the SDK's OperationTimeoutError, as it does
    when its own runs out; without a ``timeout`` they were unavailable regions."""
    primary, secondary = _regions()
    primary.fail_with(ErrorKind.TIMEOUT)
    secondary.fail_with(ErrorKind.TIMEOUT)
    with pytest.raises(OperationTimeoutError):
        await sessions_in_both((primary, secondary), state_updated_after=None, timeout=5.0)
    with pytest.raises(AllRegionsUnavailableError):
        await sessions_in_both((primary, secondary), state_updated_after=None, timeout=None)
