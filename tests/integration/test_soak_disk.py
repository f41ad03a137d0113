"""The soak's outbox disk: a tmpfs of its own that the nemesis fills (``full-outbox-disk``),
and what a georep outbox on it does when it is full: refuses the put with a clear error,
keeps what it held, and takes puts again once the space is back."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from georep import SqliteOutbox
from georep.cli.soak.disk import OutboxDisk
from georep.exceptions import OutboxFullError

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a tmpfs needs root"
    ),
]


@pytest.fixture
def disk(tmp_path: Path) -> OutboxDisk:
    disk = OutboxDisk(tmp_path / "outbox")
    if not disk.mount():
        pytest.skip(str(disk.why_not))
    yield disk  # type: ignore[misc]
    disk.unmount()


def test_a_full_outbox_disk_refuses_puts_and_keeps_what_it_held(disk: OutboxDisk) -> None:
    async def scenario() -> None:
        outbox = SqliteOutbox(disk.path / "sender.sqlite")
        try:
            await outbox.put("orders", [(None, b"kept")], now=1.0)
            assert disk.fill() > 0
            with pytest.raises(OutboxFullError, match="the disk is full"):
                await outbox.put("orders", [(None, b"refused")], now=2.0)
            disk.empty()
            await outbox.put("orders", [(None, b"after")], now=3.0)
            held = await outbox.records(dead=False)
            assert [record.enqueued_at for record in held] == [1.0, 3.0]
        finally:
            await outbox.aclose()

    asyncio.run(scenario())


def test_the_disk_is_gone_once_unmounted(tmp_path: Path) -> None:
    disk = OutboxDisk(tmp_path / "outbox")
    if not disk.mount():
        pytest.skip(str(disk.why_not))
    assert os.path.ismount(disk.path)
    disk.unmount()
    assert not os.path.ismount(disk.path)
    with pytest.raises(RuntimeError, match=r"root|mount"):
        disk.fill()
