"""georep after ``os.fork()`` (issue 31, defect 2): a georep.sync.GeoSender made in the
parent (gunicorn ``--preload``) reopens in the child and sends, where it used to wait for
ever on a loop thread the child does not have; a sync GeoReceiver and an async GeoSender
made in the parent raise ForkedProcessError at once in the child; the parent goes on."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from _helpers import drain_ids, run_python

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("_fork_worker.py")


async def test_a_preloaded_sync_sender_reopens_in_a_forked_child(
    georep_emulator: Emulator,
) -> None:
    emu = georep_emulator
    queue = f"fork-{uuid.uuid4().hex[:8]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(queue)

    run = run_python(
        str(WORKER),
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue,
        timeout=180,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["child_status"] == 0, f"the child hung or failed: {run.stderr[-3000:]}"
    child = report["child"]
    assert child["send"] == {"value": ["primary"]}
    for used in ("receive", "async"):
        assert child[used]["error"] == "ForkedProcessError", child[used]
        assert f"used in process {child['pid']}, forked from it" in child[used]["message"]
    assert "georep-sync-loop" not in child["threads"]  # the child's sender closed its own
    assert report["parent"] == [["primary"], ["primary"]]
    stored = await drain_ids(emu, "primary", queue)
    assert stored == {"parent-before": 1, "child": 1, "parent-after": 1}
