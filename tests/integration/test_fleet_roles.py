"""A fleet of sender processes sharing roles through Redis (issue 19): `georep failover`
moves all of them within a second, and an outage seen by one process moves them all with
exactly one generation step; nothing is lost or stored twice."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import REDIS_URL, REPO, drain_ids, fault, run_python

from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisRoleStore
from georep.ports import RoleRecord

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

WORKER = Path(__file__).with_name("_fleet_worker.py")
PROCESSES = 8


async def record_of(app: str, entity: str) -> RoleRecord | None:
    async with RedisRoleStore.from_url(REDIS_URL, app=app) as store:
        return await store.read(entity)


async def wait_for_record(
    app: str, entity: str, condition: Callable[[RoleRecord], bool], within: float
) -> RoleRecord:
    deadline = time.monotonic() + within
    while True:
        record = await record_of(app, entity)
        if record is not None and condition(record):
            return record
        assert time.monotonic() < deadline, f"roles never got there: {record}"
        await asyncio.sleep(0.05)


def move_times(
    reports: list[dict[str, Any]], region: str, generation: int, since: float
) -> list[float]:
    """Per process, seconds from the store's change to the process following it."""
    times = []
    for report in reports:
        [moved] = [t for t, label, gen in report["changes"] if (label, gen) == (region, generation)]
        times.append(moved - since)
    return times


def start_workers(arguments: list[str], logs: Path) -> list[subprocess.Popen[str]]:
    """The sender processes, ``_fleet_worker.py ARGUMENTS INDEX`` each. Their logs go to
    files: a worker that logs a warning per failed send would otherwise fill a pipe nobody
    reads until the end, and block."""
    workers = []
    for index in range(PROCESSES):
        with (logs / f"worker-{index}.log").open("w") as log:
            workers.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), *arguments, str(index)],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
            )
    return workers


def finish(worker: subprocess.Popen[str]) -> tuple[str, str]:
    """The worker's output once it exits; one that does not within 45 s writes its stacks
    to its log first (and the test fails, naming it)."""
    try:
        return worker.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        worker.send_signal(signal.SIGUSR1)
        worker.send_signal(signal.SIGUSR2)
        time.sleep(1)
        raise


async def test_a_fleet_follows_the_failover_command_and_an_outage_seen_by_one_process(
    emu: Emulator, private_queue: Callable[..., str], tmp_path: Path
) -> None:
    queue = private_queue("fleet")
    app = f"fleet-{uuid.uuid4().hex[:8]}"
    arguments = [emu.connection_string("primary"), emu.connection_string("secondary"), queue]
    workers = start_workers([*arguments, REDIS_URL, app, str(tmp_path)], tmp_path)
    try:
        for worker in workers:
            line = await asyncio.to_thread(worker.stdout.readline)  # type: ignore[union-attr]
            assert line == "ready\n", (tmp_path / f"worker-{workers.index(worker)}.log").read_text()
        await asyncio.sleep(1.0)

        # An operator moves every process to the secondary.
        command = await asyncio.to_thread(
            run_python,
            "-m",
            "georep.cli",
            "failover",
            "--to",
            "secondary",
            "--app",
            app,
            "--redis",
            REDIS_URL,
            timeout=30,
        )
        assert command.returncode == 0, command.stderr
        failover = await record_of(app, queue)
        assert failover is not None and (failover.active, failover.generation) == ("secondary", 1)
        await asyncio.sleep(1.5)

        # The secondary goes down; only worker 0 sends, and sees it.
        (tmp_path / "pause").touch()
        await asyncio.sleep(0.5)  # sends in flight finish
        await fault(emu, "secondary", "outage")
        (tmp_path / "send-0").touch()
        outage = await wait_for_record(app, queue, lambda r: r.generation > 1, within=10)
        await asyncio.sleep(1.0)
        (tmp_path / "pause").unlink()
        await asyncio.sleep(1.0)

        # The primary turns every send away while all eight send: they race, one swaps.
        await fault(emu, "secondary", "restore")
        await fault(emu, "primary", "reject_sends", "server-busy")
        await wait_for_record(app, queue, lambda r: r.generation > 2, within=10)
        await asyncio.sleep(1.0)
        (tmp_path / "stop").touch()
        outputs = [await asyncio.to_thread(finish, w) for w in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        await fault(emu, "secondary", "restore")
        await fault(emu, "primary", "restore")
    assert all(w.returncode == 0 for w in workers), [
        (tmp_path / f"worker-{i}.log").read_text()[-2000:] for i in range(PROCESSES)
    ]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    # The command: every process followed within a second.
    command_moves = move_times(reports, "secondary", 1, failover.since)
    print(f"failover command: processes followed in {max(command_moves):.3f} s at most")
    assert max(command_moves) <= 1.0, command_moves

    # The outage: one generation step, made by worker 0, followed by all within a second.
    assert (outage.active, outage.generation) == ("primary", 2)
    assert outage.automatic and "automatic failover" in outage.changed_by
    assert reports[0]["swaps"] >= 1
    outage_moves = move_times(reports[1:], "primary", 2, outage.since)
    print(f"outage seen by one: the other processes followed in {max(outage_moves):.3f} s at most")
    assert max(outage_moves) <= 1.0, outage_moves

    # The race: one more generation step, whoever won; two automatic swaps in all.
    final = await record_of(app, queue)
    assert final is not None and (final.active, final.generation) == ("secondary", 3)
    assert sum(r["swaps"] for r in reports) == 2
    assert {(r["active"], r["generation"], r["shared"]) for r in reports} == {
        ("secondary", 3, True)
    }

    # Nothing lost, nothing stored twice.
    assert [r["failed"] for r in reports] == [[]] * PROCESSES
    acknowledged = {mid: region for r in reports for mid, region in r["accepted"].items()}
    stored = await drain_ids(emu, "primary", queue) + await drain_ids(emu, "secondary", queue)
    assert set(acknowledged) - set(stored) == set()
    assert [mid for mid, count in stored.items() if count > 1] == []
    regions = Counter(acknowledged.values())
    assert regions["primary"] and regions["secondary"], regions
