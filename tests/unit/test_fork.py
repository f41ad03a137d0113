"""Objects made before a fork and used after it (issue 31, defect 2), without forking:
the fork count is what the ``os.register_at_fork`` hook bumps in a child. The real fork,
with georep.sync reopening a sender, is tests/integration/test_fork.py."""

from __future__ import annotations

import os

import pytest
from _senders import geo, regions

from georep import ClosedError, ForkedProcessError, _fork
from georep.testing import FakeClock, FakeMessage, InMemoryOutbox


def forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a child forked from this process."""
    monkeypatch.setattr(_fork, "_forks", _fork.fork_count() + 1)


async def test_an_async_sender_made_before_a_fork_refuses_at_once_in_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, clock=FakeClock())
    await sender.send_messages(FakeMessage(b"parent"))
    forked(monkeypatch)

    with pytest.raises(ForkedProcessError, match=rf"created in process {os.getpid()}"):
        await sender.send_messages(FakeMessage(b"child"))
    with pytest.raises(ForkedProcessError, match="this GeoSender"):
        await sender.__aenter__()
    await sender.aclose()  # only marked closed: what it holds is the parent's

    assert sender.closed and len(primary.accepted) == 1
    assert issubclass(ForkedProcessError, ClosedError)  # existing except ClosedError still works


async def test_an_object_made_in_the_child_works_and_a_parents_outbox_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outbox = InMemoryOutbox()
    forked(monkeypatch)
    primary, secondary = regions()
    async with geo(primary, secondary, clock=FakeClock()) as sender:
        assert (await sender.send_messages(FakeMessage(b"child"))).accepted == ("primary",)
    with pytest.raises(ForkedProcessError, match="this InMemoryOutbox"):
        await outbox.__aenter__()
