"""The ledger audit as a standalone Spark application.

Run it with Python or with spark-submit (which then decides the master)::

    python -m georep.adapters.spark.audit_job LEDGER_DIR --out DIR [--master local[2]]
    JOB="$(python -c 'import georep.adapters.spark.audit_job as m; print(m.__file__)')"
    spark-submit --master local[2] "$JOB" LEDGER_DIR --out DIR

Exit status: 0 when nothing was lost or processed more than once, 1 otherwise, 2 on bad input
or when the audit could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

# Absolute imports: spark-submit runs this file as a script, outside its package.
from georep.adapters.spark._audit import audit
from georep.exceptions import ConfigurationError


def _window(text: str) -> tuple[str, str]:
    start, separator, end = text.partition(",")
    if not separator:
        raise argparse.ArgumentTypeError(
            f"outage window {text!r} must be START,END in ISO 8601 UTC, "
            "e.g. 2026-01-01T00:04:00Z,2026-01-01T00:05:00Z"
        )
    return start.strip(), end.strip()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run :func:`audit`, print the summary; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="georep-audit", description="Audit a georep delivery ledger with Spark."
    )
    parser.add_argument("ledger_dir", help="the ledger directory (sends/, receives/, meta/)")
    parser.add_argument("--out", help="directory for report.json, timeline.png, latency_cdf.png")
    parser.add_argument(
        "--master", default=None, help="Spark master (default: spark-submit's, else local[*])"
    )
    parser.add_argument(
        "--outage", type=_window, action="append", default=[], help="START,END (repeat)"
    )
    parser.add_argument("--no-plots", action="store_true", help="write report.json only")
    args = parser.parse_args(argv)
    try:
        report = audit(
            args.ledger_dir,
            out_dir=args.out,
            master=args.master,
            outage_windows=args.outage,
            plots=not args.no_plots,
        )
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # 1 means "messages lost": a crash must not read as that
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: the audit could not run: {type(exc).__name__}: {first}", file=sys.stderr)
        return 2
    try:
        from rich.console import Console

        from georep.adapters.spark._table import report_table

        Console().print(report_table(report))
    except ImportError:
        summary = ("sent", "processed", "lost", "processed_more_than_once")
        print(json.dumps({key: report[key] for key in summary}))
    if "report_path" in report:
        print(f"report: {report['report_path']}")
    for path in report.get("plots", {}).values():
        print(f"plot: {path}")
    return 1 if report["lost"] or report["processed_more_than_once"] else 0


if __name__ == "__main__":
    sys.exit(main())
