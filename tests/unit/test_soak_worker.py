"""The soak worker's exit watch: a worker still running after SIGTERM writes what each
thread and each asyncio task is doing (a thread's stack shows only ``select``); the Spark
sender acknowledges the rows of committed micro-batches."""

from __future__ import annotations

import asyncio
import faulthandler
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from georep.cli.soak.worker import _STACK_FILES, WorkerSpec, _Worker


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[_Worker]:
    """A soak worker in ``tmp_path``; the signal handlers it installs are put back after, and
    the stack file it keeps open for faulthandler (for the life of a worker's process) is
    closed."""
    for sub in ("history", "stacks", "status"):
        (tmp_path / sub).mkdir()
    spec = WorkerSpec(
        name="receive-q-0", role="receiver", entity="q", run_dir=str(tmp_path),
        primary="", secondary="", redis_url="",
    )  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        yield _Worker(spec, exit_watch=3600.0)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        faulthandler.unregister(signal.SIGUSR1)
        while _STACK_FILES:
            _STACK_FILES.pop().close()


def test_a_worker_slow_to_exit_writes_the_stack_of_the_task_that_holds_it(
    worker: _Worker, tmp_path: Path
) -> None:
    async def stuck_closing() -> None:
        await asyncio.Event().wait()

    async def scenario() -> None:
        worker.loops.append(asyncio.get_running_loop())
        task = asyncio.create_task(stuck_closing(), name="stuck")
        await asyncio.sleep(0)
        # From another thread, as the watch runs; the loop waits meanwhile.
        await asyncio.to_thread(worker._watch_exit, 0)
        task.cancel()

    asyncio.run(scenario())
    dump = (tmp_path / "stacks" / "receive-q-0.0.txt").read_text()
    assert "still running 0 s after SIGTERM" in dump
    assert "asyncio task(s) left" in dump
    assert "in stuck_closing" in dump  # the task's own frame, not just the loop's select
    assert "Current thread" in dump or "Thread 0x" in dump  # every thread's stack too


def test_the_soak_prints_a_hung_process_with_its_tasks_from_the_exit_watch(tmp_path: Path) -> None:
    from georep.cli._soak import _hang_evidence

    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "send-paired.0.txt").write_text(
        "an earlier dump\n--- still running 20 s after SIGTERM\n"
        "--- 1 asyncio task(s) left on <loop>\n  File 'x.py', line 3, in stuck_closing\n"
    )
    lines = _hang_evidence(
        ["send-paired (did not exit 60 s after SIGTERM)", "syphon (exited 1)"], tmp_path
    )
    assert lines == [
        "hung: send-paired (did not exit 60 s after SIGTERM)",
        "  --- still running 20 s after SIGTERM",
        "  --- 1 asyncio task(s) left on <loop>",
        "    File 'x.py', line 3, in stuck_closing",
        "hung: syphon (exited 1)",
    ]


def test_a_spark_senders_rows_are_acknowledged_by_the_batches_its_checkpoint_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from georep.cli.soak.worker import _CommittedFiles, _input_files

    checkpoint = tmp_path / "checkpoint"
    committed_files = _CommittedFiles(checkpoint)
    assert committed_files() == set()  # the query has not started yet
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "sources" / "0").mkdir(parents=True)
    for batch in (0, 1):
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}\n")
    inbox = tmp_path / "in box"  # a space: Spark logs the path URL-quoted
    for batch, names in {0: ["a.json"], 1: ["b.json", "c.json"], 2: ["d.json"]}.items():
        lines = [
            json.dumps({"path": (inbox / n).as_uri(), "timestamp": 1, "batchId": batch})
            for n in names
        ]
        (checkpoint / "sources" / "0" / str(batch)).write_text("\n".join(["v1", *lines]))
    (checkpoint / "sources" / "0" / ".2.tmp").write_text("v1\n{not json")
    assert committed_files() == {str(inbox / n) for n in ("a.json", "b.json", "c.json")}
    # Batch 2 commits; batch 3's files are only in a compacted log.
    (checkpoint / "commits" / "2").write_text("v1\n{}\n")
    (checkpoint / "commits" / "3").write_text("v1\n{}\n")
    entry = {"path": (inbox / "e.json").as_uri(), "timestamp": 1, "batchId": 3}
    (checkpoint / "sources" / "0" / "3.compact").write_text("v1\n" + json.dumps(entry))
    assert committed_files() == {str(inbox / f"{n}.json") for n in "abcde"}
    # The files written, found from a relative directory (CI's report is `soak-report`),
    # are the ones Spark's logs name: none is left pending once every batch committed.
    inbox.mkdir()
    for name in "abcde":
        (inbox / f"{name}.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert _input_files(Path("in box")) - committed_files() == set()


def test_a_spark_senders_files_are_acknowledged_by_the_log_entries_its_batches_read(
    tmp_path: Path,
) -> None:
    """After a kill between the file source's log entry and the batch's offsets, the next
    incarnation's batches run one behind the log: batch 2 reads entries 2 and 3, and batch
    3 entry 4 (seen in CI's soak: the last file stayed pending and the run never went
    quiet)."""
    from georep.cli.soak.worker import _CommittedFiles

    checkpoint = tmp_path / "checkpoint"
    for directory in ("commits", "offsets", "sources/0"):
        (checkpoint / directory).mkdir(parents=True)
    inbox = tmp_path / "inbox"
    for entry in range(5):
        line = json.dumps({"path": (inbox / f"{entry}.json").as_uri(), "batchId": entry})
        (checkpoint / "sources" / "0" / str(entry)).write_text(f"v1\n{line}")
    committed_files = _CommittedFiles(checkpoint)

    def commit(batch: int, log_offset: int) -> set[str]:
        (checkpoint / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0}\n' + json.dumps({"logOffset": log_offset})
        )
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}\n")
        return {p.rsplit("/", 1)[-1] for p in committed_files()}

    assert commit(0, 0) == {"0.json"}
    assert commit(1, 1) == {"0.json", "1.json"}
    # Killed after logging entry 2; the next incarnation's batch 2 reads entries 2 and 3.
    assert commit(2, 3) == {"0.json", "1.json", "2.json", "3.json"}
    assert commit(3, 4) == {f"{entry}.json" for entry in range(5)}


def test_a_signal_arriving_while_the_stop_flags_lock_is_held_still_stops_the_worker(
    worker: _Worker,
) -> None:
    """The seed-28 soak hang: a second SIGTERM interrupted the first one's handler inside
    ``Event.set`` and the nested handler waited for the lock its own thread held. Here the
    handler runs while its thread holds that lock, as a signal would find it."""
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)

    def interrupted_inside_set() -> None:
        with worker.stop._cond:  # type: ignore[attr-defined]  # what Event.set holds
            handler(signal.SIGTERM, None)
            handler(signal.SIGINT, None)

    victim = threading.Thread(target=interrupted_inside_set, daemon=True)
    victim.start()
    victim.join(10)
    assert not victim.is_alive(), "the signal handler waited for a lock its thread held"
    assert worker.stop.wait(10)
    assert "stopping" in worker.status


def test_signals_raised_back_to_back_stop_the_worker_once(worker: _Worker) -> None:
    first: list[float] = []
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
        signal.raise_signal(sig)  # the handler runs now, on this (the main) thread
        if worker.stop.wait(10) and not first:
            first.append(worker.status["stopping"])
    assert worker.status["stopping"] == first[0]  # stopped once, not once per signal
