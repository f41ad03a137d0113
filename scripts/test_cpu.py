"""Run the suite and show where its CPU goes: the suite is CPU-bound on two cores, so its
wall time is about the CPU seconds it needs divided by two.

    .venv/bin/python scripts/test_cpu.py [pytest arguments]

It runs ``scripts/test.sh`` (with the arguments) with ``GEOREP_CPU_REPORT`` set (one line per
test: unit, worker pid, start, wall; see tests/conftest.py), and meanwhile reads every
process's CPU time from ``/proc`` twice a second. A process started by a worker (an
emulator, a Spark JVM, a CLI run, a Redis Cluster node) is charged to the test that worker
was running when it started, with all the CPU it used until it ended. It prints:

- the machine's busy CPU seconds against the wall time (busy ~ 2 x wall: CPU-bound);
- CPU seconds by kind of process (Spark JVMs, emulators, the workers themselves, ...);
- the units that cost the most CPU, with their wall time, and the tests (a Spark lane is
  one unit of many tests);
- the commands that cost the most CPU, alike ones together (numbers and temporary paths
  blanked), with how many processes ran each.

A process that lived less than half a second may be missed, and one whose parent exited
before it was seen (a daemon) is counted under its kind but not charged to a unit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")

#: Kinds of process, by what their command line holds (first match).
KINDS = (
    ("org.apache.spark", "Spark JVM"),
    ("spark-class", "Spark JVM"),
    ("pyspark.daemon", "Spark Python workers"),
    ("python_streaming_source_runner", "Spark Python workers"),
    ("georep.adapters.emulator", "emulator"),
    ("redis-server", "redis-server"),
    ("exec(eval(sys.stdin", "pytest workers"),
    ("georep.cli", "georep CLI"),
    ("bin/georep", "georep CLI"),
    ("run_doc.py", "docs pages"),
    ("python", "other Python"),
)


class Processes:
    """Every process seen: its command line, parent, first sighting, and the CPU time it
    used while watched (all of it for a process started meanwhile; for one running before,
    such as a Redis server, what it used since the first look)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, str], list] = {}
        self._before: dict[tuple[int, str], float] = {}
        self._first = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Processes:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            now = time.time()
            for name in os.listdir("/proc"):
                if name.isdigit():
                    self._read(int(name), now)
            self._first = False
            if self._stop.wait(0.5):
                return

    def _read(self, pid: int, now: float) -> None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICKS
            key = (pid, fields[19])  # pid and start time: a reused pid is another process
            if key in self.seen:
                self.seen[key][3] = cpu - self._before.get(key, 0.0)
                return
            if self._first:
                self._before[key] = cpu
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            command = raw.replace(b"\0", b" ").decode(errors="replace")
            self.seen[key] = [command, int(fields[1]), now, cpu - self._before.get(key, 0.0)]
        except (OSError, IndexError, ValueError):
            pass  # gone meanwhile


def _busy() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / TICKS


def kind_of(command: str) -> str:
    return next((kind for marker, kind in KINDS if marker in command), "other")


def command_shape(command: str) -> str:
    """``command`` with what differs between runs of one command blanked: temporary paths,
    numbers (ports, pids, seeds), and a long ``-c`` program cut to its start."""
    shape = re.sub(r"/tmp/\S*", "/tmp/…", command)
    shape = re.sub(r"\d+", "N", shape)
    return shape[:150]


def main(args: list[str]) -> int:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import unit_of

    report = Path(tempfile.mkdtemp(prefix="georep-cpu-")) / "tests.jsonl"
    environment = {**os.environ, "GEOREP_CPU_REPORT": str(report)}
    busy, wall = _busy(), time.monotonic()
    with Processes() as processes:
        status = subprocess.call(["bash", "scripts/test.sh", *args], cwd=REPO, env=environment)
    busy, wall = _busy() - busy, time.monotonic() - wall
    tests = (
        [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    )
    by_worker: dict[int, list[dict]] = defaultdict(list)
    for test in tests:
        by_worker[test["pid"]].append(test)
    parents = {pid: parent for (pid, _), (_, parent, _, _) in processes.seen.items()}

    def worker_of(pid: int) -> int | None:
        for _ in range(64):
            if pid in by_worker:
                return pid
            if pid not in parents:
                return None
            pid = parents[pid]
        return None

    kinds: dict[str, float] = defaultdict(float)
    kind_counts: dict[str, int] = defaultdict(int)
    commands: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    units: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    by_test: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for test in tests:
        units[test["unit"]][1] += test["wall"]
        by_test[test["test"]][1] += test["wall"]
    for (pid, _), (command, _, first_seen, cpu) in processes.seen.items():
        kinds[kind_of(command)] += cpu
        kind_counts[kind_of(command)] += 1
        commands[command_shape(command)][0] += cpu
        commands[command_shape(command)][1] += 1
        worker = worker_of(pid)
        if worker is None or worker == pid:
            continue
        running = [t for t in by_worker[worker] if t["start"] - 1 <= first_seen]
        if running:
            units[unit_of(running[-1]["test"])][0] += cpu
            by_test[running[-1]["test"]][0] += cpu
    for test in tests:  # the worker's own CPU (its children's is counted above)
        units[test["unit"]][0] += test.get("own", 0.0)
        by_test[test["test"]][0] += test.get("own", 0.0)
    print(f"\nmachine: {busy:.0f} CPU-seconds busy in {wall:.0f} s wall ({busy / wall:.2f} cores)")
    print("\nCPU seconds by kind of process, with how many processes:")
    for kind, cpu in sorted(kinds.items(), key=lambda item: -item[1]):
        print(f"  {cpu:7.1f} cpu {kind_counts[kind]:5d} x  {kind}")
    print("\nunits by CPU seconds (their own, and their child processes'), with wall seconds:")
    for unit, (cpu, seconds) in sorted(units.items(), key=lambda item: -item[1][0])[:25]:
        print(f"  {cpu:7.1f} cpu {seconds:7.1f} s  {unit}")
    print("\ntests by CPU seconds (their own, and the processes started while they ran):")
    for test, (cpu, seconds) in sorted(by_test.items(), key=lambda item: -item[1][0])[:40]:
        print(f"  {cpu:7.1f} cpu {seconds:7.1f} s  {test.removeprefix('tests/')[-110:]}")
    print("\ncommands by CPU seconds (alike ones together), with how many processes ran them:")
    for shape, (cpu, count) in sorted(commands.items(), key=lambda item: -item[1][0])[:60]:
        print(f"  {cpu:7.1f} cpu {count:5.0f} x  {shape}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
