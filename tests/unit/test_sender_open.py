"""What a GeoSender says and does when a region cannot be opened (issue 31, defect 5):
each failure is named for what it is, and ``verify_on_open=True`` refuses to start when a
region answered that the entity cannot be used there."""

from __future__ import annotations

import logging

import pytest
from _senders import geo, regions

from georep import AuthenticationError, ConfigurationError, EntityNotFoundError, ErrorKind
from georep.testing import FakeClock, FakeMessage


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (ErrorKind.ENTITY_NOT_FOUND, "secondary (west.example) has no entity 'orders'"),
        (ErrorKind.ENTITY_DISABLED, "secondary (west.example) has entity 'orders' disabled"),
        (ErrorKind.AUTHENTICATION, "secondary (west.example) refused the credentials"),
        (ErrorKind.CONNECTION, "secondary (west.example) could not be reached while connecting"),
        (ErrorKind.TIMEOUT, "secondary (west.example) did not answer while connecting"),
    ],
)
async def test_an_open_failure_is_logged_as_what_it_is(
    kind: ErrorKind, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = regions()
    secondary.fail_with(kind)
    caplog.set_level(logging.WARNING, "georep.sender")

    async with geo(primary, secondary, clock=FakeClock()):
        pass

    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(said), line
    if kind is not ErrorKind.TIMEOUT:
        assert "did not answer" not in line


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        (ErrorKind.ENTITY_NOT_FOUND, EntityNotFoundError),
        (ErrorKind.AUTHENTICATION, AuthenticationError),
    ],
)
async def test_a_strict_start_refuses_a_region_that_answered_no(
    kind: ErrorKind, error: type[Exception]
) -> None:
    primary, secondary = regions()
    secondary.fail_with(kind)
    sender = geo(primary, secondary, clock=FakeClock(), verify_on_open=True)

    with pytest.raises(
        error, match=r"verify_on_open=True\) for 'orders': secondary \(west"
    ) as info:
        await sender.__aenter__()

    assert info.value.region == "secondary"  # type: ignore[attr-defined]
    assert sender.closed  # nothing it opened stays open


async def test_a_strict_start_names_both_regions_when_both_refuse() -> None:
    primary, secondary = regions()
    primary.fail_with(ErrorKind.ENTITY_NOT_FOUND)
    secondary.fail_with(ErrorKind.AUTHENTICATION)
    sender = geo(primary, secondary, clock=FakeClock(), verify_on_open=True)

    with pytest.raises(EntityNotFoundError, match=r"primary .*; and secondary .*credentials"):
        await sender.__aenter__()


async def test_a_strict_start_still_starts_while_a_region_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, secondary = regions()
    secondary.fail_with(ErrorKind.CONNECTION)  # down, or unreachable: cannot tell which

    async with geo(primary, secondary, clock=FakeClock(), verify_on_open=True) as sender:
        assert (await sender.send_messages(FakeMessage(b"x"))).accepted == ("primary",)
    assert any("could not be reached" in r.getMessage() for r in caplog.records)


def test_verify_on_open_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="verify_on_open"):
        geo(*regions(), verify_on_open="yes")
