"""``georep soak``: a randomized fault soak with a checker (docs/soak.md).

The run itself is :mod:`georep.cli.soak` (runner, worker, nemesis, schedule, checker,
report); this module is the command line over it.
"""

from __future__ import annotations

__all__ = ["soak"]

import asyncio
import random
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from georep.cli._errors import fail

console = Console()


def soak(
    seconds: Annotated[
        float | None,
        typer.Option(min=3, help="Seconds of faults (the senders send meanwhile)."),
    ] = None,
    minutes: Annotated[
        float | None, typer.Option(min=0.05, help="Minutes of faults (fractions accepted).")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Schedule seed (default random, printed): same seed, same faults."),
    ] = None,
    processes: Annotated[
        int, typer.Option(min=1, help="Receiver processes per entity (sharing one seen-set).")
    ] = 2,
    faults: Annotated[
        list[str] | None,
        typer.Option(help="Fault kinds, a,b or repeated (default all; `--faults list`)."),
    ] = None,
    report: Annotated[Path, typer.Option(help="Directory of the run and its report.")] = Path(
        "soak-report"
    ),
    rate: Annotated[float, typer.Option(min=0.1, help="Messages per second per sender.")] = 4.0,
    quiet_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds after the faults by which all must be quiet.")
    ] = 120.0,
    audit: Annotated[
        str, typer.Option(help="The checker's audit: pyarrow (fast) or spark.")
    ] = "pyarrow",
    seen_set: Annotated[
        str,
        typer.Option(
            help="The receivers' seen-set: redis (the soak's server) or cluster (a Redis "
            "Cluster of three masters)."
        ),
    ] = "redis",
    spark: Annotated[
        bool | None,
        typer.Option(
            "--spark/--no-spark",
            help="Run the Spark sink as a sender (default: when PySpark and Java are there).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Soak georep: senders and receivers in separate processes, a nemesis injecting faults
    from a seeded schedule, then a quiet period and a checker over the ledger.

    Exit status 0 when nothing was lost, processed twice or out of session order and the
    system went quiet; 1 otherwise; 2 on bad input.
    """
    from georep.cli.soak.runner import SoakConfig, kinds_help, run_soak
    from georep.exceptions import ConfigurationError

    kinds = tuple(k.strip() for given in faults or ["all"] for k in given.split(",") if k.strip())
    if kinds == ("list",):
        for line in kinds_help().split("; "):
            console.print(line, highlight=False)
        raise typer.Exit(0)
    if seconds is not None and minutes is not None:
        raise fail(console, "give --seconds or --minutes, not both")
    length = seconds if seconds is not None else 60.0 * (minutes if minutes is not None else 1.0)
    chosen_seed = seed if seed is not None else random.SystemRandom().randrange(1_000_000)
    try:
        config = SoakConfig(
            seconds=length,
            seed=chosen_seed,
            report_dir=report,
            processes=processes,
            kinds=kinds,
            rate=rate,
            quiet_timeout=quiet_timeout,
            engine=audit,
            seen_set=seen_set,
            spark=spark,
        )
    except ConfigurationError as exc:
        raise fail(console, str(exc)) from None
    console.print(f"soak: seed {chosen_seed}, {length:g} s of faults -> {report}", highlight=False)

    def show(line: str) -> None:
        console.print(f"soak: {line}", highlight=False)

    try:
        result = asyncio.run(run_soak(config, progress=show))
    except ConfigurationError as exc:
        raise fail(console, str(exc)) from None
    for verdict in result.verdicts:
        console.print(
            f"{verdict.entity}: sent {verdict.sent}, processed {verdict.processed}, lost "
            f"{verdict.lost}, twice {verdict.processed_twice} ({verdict.twice_after_kill} "
            f"after a kill), out of order {verdict.out_of_order}",
            highlight=False,
        )
    for line in _hang_evidence(result.hung, report):
        console.print(line, highlight=False, soft_wrap=True)
    quiet = result.seconds_to_quiet
    console.print(
        f"quiet {quiet:.1f} s after the faults" if quiet is not None else "NOT quiet",
        highlight=False,
    )
    console.print(
        f"{'PASSED' if result.passed else 'FAILED'}: {report / 'report.md'} (seed {chosen_seed})",
        highlight=False,
    )
    raise typer.Exit(0 if result.passed else 1)


def _hang_evidence(hung: list[str], report: Path, *, lines: int = 60) -> list[str]:
    """What a hung process was doing, for a terminal (or a CI log) that shows only the end:
    each hung process and its newest stack dump (from the asyncio tasks the worker wrote
    when it had not exited 20 s after SIGTERM, if it did; else the end of the file)."""
    evidence: list[str] = []
    for entry in hung:
        evidence.append(f"hung: {entry}")
        name = entry.split(" ", 1)[0]
        dumps = sorted(
            (report / "stacks").glob(f"{name}.*.txt"), key=lambda path: path.stat().st_mtime
        )
        text = dumps[-1].read_text(errors="replace").splitlines() if dumps else []
        marks = [i for i, line in enumerate(text) if line.startswith("--- still running")]
        shown = text[marks[-1] :][:lines] if marks else text[-lines:]
        evidence.extend(f"  {line}" for line in shown)
    return evidence
