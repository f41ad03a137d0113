"""The benchmark record: what every benchmark writes, and how a quick run is judged.

Every benchmark ends with :func:`write_record`: one JSON file per benchmark, with a stable
name, under ``benchmarks/results/`` (``<name>.json`` for a full run; a quick run, the small
form ``--quick`` runs in a few seconds, goes to ``benchmarks/results/quick/``, which git
ignores, or to ``$GEOREP_BENCH_RECORD_DIR`` when set: the checker's temporary directory).
A record holds the ratios against the baseline measured in the same run (the raw SDK, no
ledger, the direct endpoint...: higher is better, 1.0 is "as fast"), CPU seconds per
message, memory, the exact command, the git commit, a timestamp and the machine.

``benchmarks/results/baseline.json`` holds, per quick benchmark and per ratio, the mean and
spread of five quick runs and the noise band derived from them (:func:`band`).
:func:`compare` judges a quick run against it: a ratio below ``mean - band`` fails.
``benchmarks/check.py`` runs the quick forms and prints the comparison.

This module imports only the standard library: the unit tests load it without the SDK.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE = RESULTS / "baseline.json"
RECORD_DIR_ENV = "GEOREP_BENCH_RECORD_DIR"

#: The smallest band, as a fraction of the mean: five runs on a shared two-core machine
#: under-state the noise of the next run (another helper's test suite, a CI neighbour),
#: and CI may run on another machine than the baseline's. 0.10 failed a CI run whose
#: ratio sat 10 % under a baseline of five runs within 5 % of each other (drop-in vs one
#: namespace, 0.46 against 0.51 twice); 0.15 still catches a 20 % drop.
MIN_BAND_FRACTION = 0.15
#: The band in standard deviations of the five runs, when that is wider than the floor.
BAND_SIGMAS = 3.0


class BaselineError(Exception):
    """The baseline file is missing, unreadable, or lacks a benchmark or ratio."""


def machine() -> dict[str, Any]:
    """What the figures were taken on: CPU model, cores, memory, OS, Python, load."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def describe_machine(described: Mapping[str, Any]) -> str:
    """One line for documents: ``2 cores of <cpu>, 16 GiB, Linux ..., Python 3.11.7``."""
    return (
        f"{described.get('cores')} cores of {described.get('cpu')}, "
        f"{described.get('memory_gib')} GiB, {described.get('os')}, "
        f"Python {described.get('python')}"
    )


def git_commit() -> str:
    """The checkout's commit, with ``+dirty`` when files differ from it; ``?`` outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "?"
    return commit + ("+dirty" if dirty else "")


def command_line() -> str:
    """The command that is running, as typed from the repository root."""
    return shlex.join([".venv/bin/python", *sys.argv])


def peak_rss_mib() -> float:
    """This process's peak resident memory, MiB (children are in their own records)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def record_path(name: str, *, quick: bool) -> Path:
    """Where the record of benchmark ``name`` goes (see the module docstring)."""
    override = os.environ.get(RECORD_DIR_ENV)
    if override:
        return Path(override) / f"{name}.json"
    return (RESULTS / "quick" if quick else RESULTS) / f"{name}.json"


def write_record(
    name: str,
    *,
    quick: bool,
    ratios: Mapping[str, float],
    cpu_per_message_us: Mapping[str, float] | None = None,
    memory_mib: Mapping[str, float] | None = None,
    figures: Mapping[str, Any] | None = None,
) -> Path:
    """Write benchmark ``name``'s record; return its path.

    Args:
        name: The benchmark's stable name (its script's stem).
        quick: Whether this is the small ``--quick`` form.
        ratios: Each ratio against the baseline of the same run; higher is better.
        cpu_per_message_us: Client CPU microseconds per (logical) message, per variant.
        memory_mib: Peak resident memory per process kind, MiB (``driver`` at least).
        figures: Anything else the benchmark measured (rates, latencies, counts).
    """
    record = {
        "benchmark": name,
        "quick": quick,
        "command": command_line(),
        "commit": git_commit(),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "ratios": {key: round(value, 3) for key, value in ratios.items()},
        "cpu_per_message_us": {
            key: round(value, 1) for key, value in (cpu_per_message_us or {}).items()
        },
        "memory_mib": dict(memory_mib or {"driver": peak_rss_mib()}),
        "figures": dict(figures or {}),
    }
    path = record_path(name, quick=quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"\nrecord: {path}")
    return path


# ------------------------------------------------------------------------------ judging


def band(runs: Sequence[float]) -> float:
    """The noise band of a ratio measured ``runs`` times: the wider of
    :data:`BAND_SIGMAS` standard deviations and :data:`MIN_BAND_FRACTION` of the mean.

    Raises:
        ValueError: Fewer than two runs (no spread to measure).
    """
    if len(runs) < 2:
        raise ValueError(f"a band needs at least two runs, got {len(runs)}: run the baseline")
    mean = statistics.fmean(runs)
    return max(BAND_SIGMAS * statistics.stdev(runs), MIN_BAND_FRACTION * abs(mean))


def summarise(runs: Sequence[float]) -> dict[str, Any]:
    """The baseline entry of one ratio: its runs, mean, spread (max - min), stdev, band."""
    return {
        "runs": [round(r, 3) for r in runs],
        "mean": round(statistics.fmean(runs), 3),
        "spread": round(max(runs) - min(runs), 3),
        "stdev": round(statistics.stdev(runs), 3) if len(runs) > 1 else 0.0,
        "band": round(band(runs), 3),
    }


@dataclass(frozen=True)
class Verdict:
    """One ratio of one benchmark: the baseline's mean and band, and the figure now."""

    benchmark: str
    ratio: str
    mean: float
    band: float
    now: float | None

    @property
    def floor(self) -> float:
        return self.mean - self.band

    @property
    def passed(self) -> bool:
        return self.now is not None and self.now >= self.floor

    def row(self) -> str:
        now = "missing" if self.now is None else f"{self.now:.2f}"
        status = "ok" if self.passed else "FAIL"
        return (
            f"{self.benchmark:16} {self.ratio:44} {self.mean:8.2f} {self.band:6.2f}"
            f" {self.floor:7.2f} {now:>7}  {status}"
        )


HEADER = (
    f"{'benchmark':16} {'ratio (higher is better)':44} {'baseline':>8} {'band':>6}"
    f" {'floor':>7} {'now':>7}  verdict"
)


def load_baseline(path: Path = BASELINE) -> dict[str, Any]:
    """The baseline file's contents.

    Raises:
        BaselineError: The file is missing or not JSON with a ``benchmarks`` mapping.
    """
    if not path.exists():
        raise BaselineError(
            f"no baseline at {path}: record one with "
            "`flock /tmp/georep-heavy.lock .venv/bin/python benchmarks/check.py --baseline`"
        )
    try:
        baseline: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BaselineError(
            f"the baseline {path} is not readable JSON ({exc}): record it again"
        ) from None
    if not isinstance(baseline.get("benchmarks"), dict):
        raise BaselineError(
            f"the baseline {path} has no 'benchmarks' mapping: record it again"
        ) from None
    return baseline


def compare(baseline: Mapping[str, Any], name: str, ratios: Mapping[str, float]) -> list[Verdict]:
    """Judge one quick run's ``ratios`` against benchmark ``name`` in ``baseline``: a
    verdict per ratio the baseline holds (one the run lacks fails as ``missing``).

    Raises:
        BaselineError: The baseline has no entry for ``name``.
    """
    entry = baseline.get("benchmarks", {}).get(name)
    if entry is None:
        raise BaselineError(
            f"the baseline has no benchmark {name!r}: record it with "
            f"`benchmarks/check.py --baseline --only {name}`"
        )
    return [
        Verdict(name, ratio, float(stats["mean"]), band(stats["runs"]), ratios.get(ratio))
        for ratio, stats in entry["ratios"].items()
    ]


# ----------------------------------------------------------------------------- summary

BLOCK_BEGIN = "<!-- benchmark-record:begin (benchmarks/check.py --summary writes this) -->"
BLOCK_END = "<!-- benchmark-record:end -->"


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between :data:`BLOCK_BEGIN` and :data:`BLOCK_END` (markers
    included) replaced by ``block`` wrapped in them; appended when the markers are absent.

    Raises:
        ValueError: Only one of the two markers is present.
    """
    wrapped = f"{BLOCK_BEGIN}\n{block.strip()}\n{BLOCK_END}"
    begin, end = text.find(BLOCK_BEGIN), text.find(BLOCK_END)
    if begin == end == -1:
        return text.rstrip("\n") + "\n\n" + wrapped + "\n"
    if begin == -1 or end < begin:
        raise ValueError("the benchmark record markers are unbalanced: keep both or neither")
    return text[:begin] + wrapped + text[end + len(BLOCK_END) :]


def summary_block(baseline: Mapping[str, Any], records: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: the quick baseline (mean, runs' range, band per ratio) and the latest full
    run of each benchmark that has a record, each with the machine it was taken on."""
    described = baseline.get("machine", {})
    lines = [
        "### Regression check: quick runs (`scripts/bench_check.sh`)",
        "",
        f"Baseline of {baseline.get('made_by', '?')}, commit {baseline.get('commit', '?')}, "
        f"{baseline.get('timestamp', '?')}, on {describe_machine(described)} "
        f"(1-minute load {described.get('load_1min')} when it ended: a shared machine). "
        "Each ratio is against its baseline measured in the same run (higher is better); "
        "the check fails a ratio below mean - band. The last column says whether the band "
        "is narrow enough to catch a 20 % drop. A ratio a quick run reports but the baseline "
        "lacks (a new one) is not judged until the next `--baseline`.",
        "",
        "| benchmark | ratio | mean | runs (min - max) | band | floor | catches -20 % |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in baseline.get("benchmarks", {}).items():
        for ratio, stats in entry["ratios"].items():
            runs, mean, width = stats["runs"], stats["mean"], band(stats["runs"])
            lines.append(
                f"| {name} | {ratio} | {mean:.2f} | {min(runs):.2f} - {max(runs):.2f} "
                f"| {width:.2f} | {mean - width:.2f} | {'yes' if width < 0.2 * mean else 'no'} |"
            )
    if records:
        lines += ["", "### Full runs (the latest record of each, `benchmarks/results/<name>.json`)"]
    for name, record in records.items():
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in record.get("ratios", {}).items())
        lines += [
            "",
            f"- **{name}** (`{record.get('command')}`, commit {record.get('commit')}, "
            f"{record.get('timestamp')}, {describe_machine(record.get('machine', {}))}, "
            f"load {record.get('machine', {}).get('load_1min')}): {ratios or 'no ratios'}",
        ]
        failover = record.get("figures", {}).get("failover_ms")
        if failover:
            lines.append(
                "  - failover p50 / p99 ms: "
                + "; ".join(
                    f"{k} {v['p50_ms']:.0f} / {v['p99_ms']:.0f}" for k, v in failover.items()
                )
            )
    return "\n".join(lines)
