"""Catch a speed regression the day it happens: run the quick form of each benchmark and
compare its ratios with the recorded baseline.

Every ratio is measured against a baseline taken in the same run (the raw SDK, mostly), so
a slower or busier machine moves both sides alike; what is compared is the ratio, never an
absolute rate. A ratio below ``baseline mean - band`` fails (``benchmarks/_record.py`` says
how the band is made from five runs). A benchmark with a failing ratio is run up to twice
more and judged on the best of its runs per ratio: noise seldom strikes twice in a row, a
regression does. The table shows baseline, band, floor and now side by side.

    scripts/bench_check.sh                       # check
    scripts/bench_check.sh --only sender         # one benchmark
    scripts/bench_check.sh --baseline            # re-baseline: five quick runs of each
    .venv/bin/python benchmarks/check.py --summary   # the figures into SUMMARY.md, README

Re-baseline when a change is meant to move a ratio (say why in its commit), or on a new
machine: on a quiet machine if you have one, else as it is (the bands then say how noisy
it is). Commit ``benchmarks/results/baseline.json``, then run ``--summary``.

Not in the quick check: ``audit.py`` and ``spark_source.py`` (Spark: tens of CPU seconds
to start a JVM and plan the jobs, too much for every push on two cores), and the benchmarks
without a ratio against a same-run baseline (``redis_memory.py``, ``redis_cluster.py``,
``emulator_throughput.py``, ``relay.py``, ``close.py``, ``ledger.py``). Their full runs still write
their records under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _record import (
    BASELINE,
    HEADER,
    RECORD_DIR_ENV,
    RESULTS,
    BaselineError,
    Verdict,
    compare,
    git_commit,
    load_baseline,
    machine,
    replace_block,
    summarise,
    summary_block,
)

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent

#: The quick form of each checked benchmark: its script's arguments.
QUICK: dict[str, list[str]] = {
    "sender": ["benchmarks/sender.py", "--quick"],
    "receiver": ["benchmarks/receiver.py", "--quick"],
    "dropin_receiver": ["benchmarks/dropin_receiver.py", "--quick"],
    "sessions": ["benchmarks/sessions.py", "--quick"],
}
RUN_TIMEOUT = 600.0


class BenchmarkFailed(Exception):
    """A quick benchmark exited with an error or wrote no record."""


def run_quick(name: str) -> dict[str, float]:
    """Run benchmark ``name``'s quick form; return its ratios.

    Raises:
        BenchmarkFailed: It exited non-zero, timed out, or wrote no record.
    """
    with tempfile.TemporaryDirectory(prefix=f"georep-bench-{name}-") as out:
        env = {**os.environ, RECORD_DIR_ENV: out}
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, *QUICK[name]],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise BenchmarkFailed(f"{name} ran longer than {RUN_TIMEOUT:g} s") from None
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            raise BenchmarkFailed(f"{name} exited with {done.returncode}:\n{tail}")
        record = Path(out) / f"{name}.json"
        if not record.exists():
            raise BenchmarkFailed(f"{name} wrote no record ({record})")
        ratios = json.loads(record.read_text())["ratios"]
    print(f"  {name}: {time.perf_counter() - started:.0f} s", flush=True)
    return {key: float(value) for key, value in ratios.items()}


def best_of(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per ratio, the best figure of several runs (a ratio missing from all stays missing)."""
    best: dict[str, float] = {}
    for ratios in runs:
        for key, value in ratios.items():
            best[key] = max(value, best.get(key, value))
    return best


def check(names: Sequence[str], baseline: Mapping[str, Any], retries: int) -> list[Verdict]:
    """Run each quick benchmark and judge it; one with a failing ratio runs again (up to
    ``retries`` times) and is judged on the best figure per ratio."""
    verdicts: list[Verdict] = []
    for name in names:
        compare(baseline, name, {})  # a benchmark missing from the baseline: fail first
        runs = [run_quick(name)]
        judged = compare(baseline, name, runs[0])
        for _ in range(retries):
            if all(v.passed for v in judged):
                break
            print(f"  {name}: below its floor; running it again", flush=True)
            runs.append(run_quick(name))
            judged = compare(baseline, name, best_of(runs))
        verdicts += judged
    return verdicts


def record_baseline(names: Sequence[str], runs: int, path: Path) -> None:
    """Run each quick benchmark ``runs`` times; write (or update) the baseline file."""
    try:
        baseline = load_baseline(path)
    except BaselineError:
        baseline = {"benchmarks": {}}
    for name in names:
        measured = [run_quick(name) for _ in range(runs)]
        keys = sorted(set().union(*measured))
        missing = [k for k in keys if any(k not in m for m in measured)]
        if missing:
            raise BenchmarkFailed(f"{name}: ratios {missing} missing from some runs")
        baseline["benchmarks"][name] = {
            "command": " ".join([".venv/bin/python", *QUICK[name]]),
            "ratios": {key: summarise([m[key] for m in measured]) for key in keys},
        }
    baseline.update(
        made_by=f"benchmarks/check.py --baseline --runs {runs}",
        commit=git_commit(),
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=machine(),
    )
    path.write_text(json.dumps(baseline, indent=2) + "\n")
    print(f"baseline: {path}")


def write_summary(baseline: Mapping[str, Any]) -> None:
    """The record's block in benchmarks/results/SUMMARY.md and the README's benchmark
    section, from the baseline and each full run's record."""
    records = {
        path.stem: json.loads(path.read_text())
        for path in sorted(RESULTS.glob("*.json"))
        if path != BASELINE
    }
    block = summary_block(baseline, records)
    for path in (RESULTS / "SUMMARY.md", REPO / "README.md"):
        path.write_text(replace_block(path.read_text(), block))
        print(f"updated {path}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(QUICK), help="these benchmarks")
    parser.add_argument("--baseline", action="store_true", help="record the baseline instead")
    parser.add_argument("--runs", type=int, default=5, help="runs per benchmark (--baseline)")
    parser.add_argument("--retries", type=int, default=2, help="re-runs of a failing benchmark")
    parser.add_argument("--file", type=Path, default=BASELINE, help="the baseline file")
    parser.add_argument(
        "--summary", action="store_true", help="write the figures into SUMMARY.md and README.md"
    )
    args = parser.parse_args(argv)
    names = args.only or list(QUICK)
    try:
        if args.summary:
            write_summary(load_baseline(args.file))
            return 0
        if args.baseline:
            record_baseline(names, args.runs, args.file)
            return 0
        baseline = load_baseline(args.file)
        print(f"quick benchmarks against {args.file} ({baseline.get('timestamp', '?')}):")
        verdicts = check(names, baseline, args.retries)
    except (BaselineError, BenchmarkFailed) as exc:
        print(f"bench check: {exc}", file=sys.stderr)
        return 2
    print()
    print(HEADER)
    for verdict in verdicts:
        print(verdict.row())
    failed = [v for v in verdicts if not v.passed]
    if failed:
        print(
            f"\n{len(failed)} ratio(s) fell below baseline - band. If the change is meant to "
            "cost this, re-baseline (benchmarks/check.py docstring) and say why in the commit."
        )
        return 1
    print(f"\nall {len(verdicts)} ratios within their bands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
