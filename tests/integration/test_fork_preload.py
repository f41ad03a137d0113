"""georep after ``os.fork()`` (issue 31, defect 2): a georep.sync.GeoSender made in the
parent (gunicorn ``--preload``) reopens in the child and sends, where it used to wait for
ever on a loop thread the child does not have; a sync GeoReceiver and an async GeoSender
made in the parent raise ForkedProcessError at once in the child; the parent goes on."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from _helpers import REDIS_URL, drain_ids, run_python

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("_fork_worker.py")


def _run_worker(emu: Emulator, worker: Path, *arguments: str) -> dict[str, Any]:
    """Run ``worker`` on a new queue (both regions); its report (the last line it printed)
    with the queue's name under ``queue``."""
    queue = f"fork-{uuid.uuid4().hex[:8]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(queue)
    run = run_python(
        str(worker),
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue,
        *arguments,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    return {**report, "queue": queue, "stderr": run.stderr[-3000:]}


async def test_a_preloaded_sync_sender_reopens_in_a_forked_child(
    georep_emulator: Emulator,
) -> None:
    emu = georep_emulator
    report = _run_worker(emu, WORKER)
    queue = report["queue"]
    assert report["child_status"] == 0, f"the child hung or failed: {report['stderr']}"
    child = report["child"]
    assert child["send"] == {"value": ["primary"]}
    for used in ("receive", "async"):
        assert child[used]["error"] == "ForkedProcessError", child[used]
        assert f"used in process {child['pid']}, forked from it" in child[used]["message"]
    assert "georep-sync-loop" not in child["threads"]  # the child's sender closed its own
    assert report["parent"] == [["primary"], ["primary"]]
    stored = await drain_ids(emu, "primary", queue)
    assert stored == {"parent-before": 1, "child": 1, "parent-after": 1}


DROPIN_WORKER = Path(__file__).with_name("_fork_dropin_worker.py")


async def test_a_preloaded_dropin_client_sends_and_receives_in_a_forked_child(
    georep_emulator: Emulator,
) -> None:
    """The drop-in blocking client made in the parent, with a RedisSeenSet from a URL, works
    in a forked child as the SDK's does (it used to raise ClosedError: "georep's loop thread
    is stopped"); a sender the parent opened raises ForkedProcessError there."""
    group = f"fork-{uuid.uuid4().hex[:8]}"
    report = _run_worker(georep_emulator, DROPIN_WORKER, REDIS_URL, group)
    assert report["child_status"] == 0, f"the child hung or failed: {report['stderr']}"
    child = report["child"]
    assert child["send"] == {"value": "sent"}
    assert child["receive"] == {"value": ["from-child", "from-parent"]}
    assert child["parents_sender"]["error"] == "ForkedProcessError", child
    assert f"used in process {child['pid']}, forked from it" in child["parents_sender"]["message"]
    assert report["parent"] == ["parent-after"]


async def test_a_preloaded_async_dropin_client_receives_in_a_forked_child(
    georep_emulator: Emulator,
) -> None:
    """The asyncio drop-in client made in the parent, each process running its own loop:
    the child's receivers read through a seen-set of its own (its receive returned [] and
    logged ForkedProcessError for the parent's seen-set), and the parent goes on."""
    group = f"fork-{uuid.uuid4().hex[:8]}"
    report = _run_worker(georep_emulator, DROPIN_WORKER, REDIS_URL, group, "async")
    assert report["child_status"] == 0, f"the child hung or failed: {report['stderr']}"
    child = report["child"]
    assert child["send"] == {"value": "sent"}
    assert child["receive"] == {"value": ["from-child", "from-parent"]}
    assert report["parent"] == ["parent-after"]
