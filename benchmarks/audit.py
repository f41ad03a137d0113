"""The Spark ledger audit on local[2] against the single-machine reference, 1M and 10M messages.

For each size it writes a synthetic ledger (0.1 % loss, 0.05 % double processing, an
outage with failovers), then times in the same run:

- Spark: ``audit(..., master="local[2]", plots=False)`` with the session already started
  (the session start is printed on its own);
- reference: ``reference_audit`` (pyarrow reads, numpy counts, one process).

It prints both times, the ratio Spark / reference, whether both reports agree with each
other and with the injected counts, and the peak resident memory of Spark's JVM and of the
Python driver (the audit collects only aggregates, so neither grows with the ledger).
Targets on a 2-core machine: 10M messages in <= 60 s and <= 3x the reference; 100M in
<= 180 s. The reference holds a whole ledger in memory, so sizes above ``--reference-max``
(default 20M) are checked against the injected counts only. ``--keep`` keeps each ledger
(and what was injected, in ``ledger-N.json`` beside it) and audits it again on the next run
instead of writing it anew (100M messages take minutes to write).

    .venv/bin/python benchmarks/audit.py [--sizes 1000000 10000000] [--dir /tmp/ledgers]
    .venv/bin/python benchmarks/audit.py --sizes 100000000 --dir /var/tmp/ledgers --keep

It writes its figures to ``benchmarks/results/audit.json`` (see ``benchmarks/_record.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from _record import write_record

from georep.adapters.spark import (
    audit,
    reference_audit,
    spark_session,
    write_synthetic_ledger,
)

MASTER = "local[2]"


def _jvm_peak_mib() -> float:
    """The peak resident set (VmHWM) of this process's child JVMs, in MiB."""
    peak = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":", 1) for line in status.read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == os.getpid() and "VmHWM" in fields:
            peak = max(peak, int(fields["VmHWM"].split()[0]))
    return peak / 1024


def _driver_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ledger(path: Path, size: int, keep: bool) -> tuple[dict[str, int], float]:
    """The injected counts of the ledger at ``path`` (written now unless kept) and the
    seconds writing it took (0 when reused)."""
    record = path.with_name(f"{path.name}.json")
    if keep and record.exists() and path.is_dir():
        return json.loads(record.read_text()), 0.0
    shutil.rmtree(path, ignore_errors=True)
    t = time.perf_counter()
    ledger = write_synthetic_ledger(path, messages=size)
    counts = {
        "lost": ledger.lost,
        "processed_more_than_once": ledger.processed_more_than_once,
        "receive_rows": ledger.receive_rows,
    }
    if keep:
        record.write_text(json.dumps(counts) + "\n")
    return counts, time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--dir", help="where to write the ledgers (default: a temporary dir)")
    parser.add_argument(
        "--reference-max",
        type=int,
        default=20_000_000,
        help="largest size also audited by the in-memory reference (default 20M)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the ledgers in --dir and reuse them on the next run",
    )
    args = parser.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="georep-audit-"))
    started = time.perf_counter()
    spark_session(MASTER)
    session_seconds = time.perf_counter() - started
    print(f"Spark session ({MASTER}) started in {session_seconds:.1f} s")
    sizes: dict[str, dict[str, object]] = {}
    speed_ups: dict[str, float] = {}
    print(f"{'messages':>11} {'rows':>11} {'files':>6} {'generate s':>10} {'spark s':>8} "
          f"{'reference s':>11} {'spark/ref':>9} {'jvm MiB':>8} {'py MiB':>7}  agree")  # fmt: skip
    try:
        for size in args.sizes:
            path = root / f"ledger-{size}"
            ledger, generated = _ledger(path, size, args.keep and bool(args.dir))
            files = sum(1 for _ in path.rglob("*.parquet"))
            t = time.perf_counter()
            spark = audit(path, master=MASTER, plots=False)
            spark_seconds = time.perf_counter() - t
            injected = (spark["lost"], spark["processed_more_than_once"]) == (
                ledger["lost"],
                ledger["processed_more_than_once"],
            )
            reference_seconds = float("nan")
            agree = injected
            if size <= args.reference_max:
                t = time.perf_counter()
                reference = reference_audit(path)
                reference_seconds = time.perf_counter() - t
                agree = injected and {k: v for k, v in spark.items() if k != "engine"} == {
                    k: v for k, v in reference.items() if k != "engine"
                }
            rows = size + ledger["receive_rows"]
            sizes[f"{size:,}"] = {
                "rows": rows,
                "files": files,
                "spark_seconds": round(spark_seconds, 2),
                "reference_seconds": round(reference_seconds, 2),
                "agree": agree,
            }
            if size <= args.reference_max:
                speed_ups[f"{size:,} messages: Spark vs reference"] = (
                    reference_seconds / spark_seconds
                )
            print(
                f"{size:>11,} {rows:>11,} {files:>6} {generated:>10.1f} {spark_seconds:>8.1f} "
                f"{reference_seconds:>11.1f} {spark_seconds / reference_seconds:>9.2f} "
                f"{_jvm_peak_mib():>8.0f} {_driver_peak_mib():>7.0f}  "
                f"{'yes' if agree else 'NO'}",
                flush=True,
            )
            if size >= 100_000_000:
                verdict = "met" if spark_seconds <= 180 else "MISSED"
                print(f"  target 100M <= 180 s: {verdict} ({spark_seconds:.0f} s)")
            elif size >= 10_000_000 and size <= args.reference_max:
                verdict = "met" if spark_seconds <= 60 else "MISSED"
                ratio = spark_seconds / reference_seconds
                print(
                    f"  target 10M <= 60 s: {verdict}; <= 3x reference: "
                    f"{'met' if ratio <= 3 else 'MISSED'} ({ratio:.2f}x)"
                )
            if not (args.keep and args.dir):
                shutil.rmtree(path, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    write_record(
        "audit",
        quick=False,
        # reference seconds / Spark seconds: higher is better, as every recorded ratio
        ratios=speed_ups,
        memory_mib={"jvm": round(_jvm_peak_mib(), 1), "driver": round(_driver_peak_mib(), 1)},
        figures={"master": MASTER, "session_start_seconds": round(session_seconds, 2), **sizes},
    )


if __name__ == "__main__":
    main()
