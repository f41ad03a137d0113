"""The ``georep`` command line: one typer command per subcommand."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the georep CLI needs typer and rich: pip install 'georep[cli]'") from exc

if TYPE_CHECKING:
    from georep._doctor import Finding

__all__ = ["app", "main"]

_T = TypeVar("_T")

app = typer.Typer(
    name="georep",
    help="Keep Azure Service Bus applications running through a regional outage.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


@app.command()
def emulator(
    namespace: Annotated[
        list[str] | None, typer.Option(help="Namespace name (repeat). Default: primary, secondary.")
    ] = None,
    port: Annotated[
        list[int] | None, typer.Option(help="Port per namespace, in order (0 = any free).")
    ] = None,
    queue: Annotated[
        list[str] | None, typer.Option(help="Queue created in every namespace (repeat).")
    ] = None,
    topic: Annotated[
        list[str] | None, typer.Option(help="Topic NAME[:SUB1,SUB2] created in every namespace.")
    ] = None,
    hybrid_connection: Annotated[
        list[str] | None,
        typer.Option(help="Relay hybrid connection created in every namespace (repeat)."),
    ] = None,
    control_port: Annotated[
        int, typer.Option(help="HTTP control endpoint port (0 = any free).")
    ] = 5710,
) -> None:
    """Run the local two-region Service Bus emulator in the foreground (Ctrl-C stops it)."""
    import os

    from georep.adapters.emulator._runner import run
    from georep.adapters.emulator._server import CONTROL_TOKEN_ENV

    raise typer.Exit(
        run(
            namespaces=namespace,
            ports=port,
            queues=queue or ["orders"],
            topics=topic or [],
            hybrid_connections=hybrid_connection or [],
            control_port=control_port,
            control_token=os.environ.get(CONTROL_TOKEN_ENV) or None,
        )
    )


@app.command()
def fault(
    namespace: Annotated[str, typer.Argument(help="Namespace to act on, e.g. primary.")],
    action: Annotated[
        str,
        typer.Argument(
            help="outage, restore, blackhole, latency, reject-sends, drop-dispositions, "
            "disaster, relay-no-listener"
        ),
    ],
    seconds: Annotated[float, typer.Option(help="For latency: seconds added per response.")] = 0.0,
    condition: Annotated[
        str | None,
        typer.Option(
            help="For reject-sends: server-busy | timeout | internal-error | quota-exceeded."
        ),
    ] = None,
    count: Annotated[int, typer.Option(help="For drop-dispositions: how many sends.")] = 1,
    path: Annotated[
        str | None, typer.Option(help="For relay-no-listener: the hybrid connection.")
    ] = None,
    off: Annotated[bool, typer.Option(help="For relay-no-listener: lift the fault.")] = False,
    control_url: Annotated[
        str, typer.Option(envvar="GEOREP_EMULATOR_CONTROL_URL", help="The emulator's control URL.")
    ] = "http://127.0.0.1:5710",
    control_token: Annotated[
        str | None,
        typer.Option(
            envvar="GEOREP_EMULATOR_CONTROL_TOKEN",
            help="The control token `georep emulator` printed.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Inject a fault into a running emulator (`georep emulator`) through its control endpoint."""
    import json
    import urllib.error
    import urllib.request

    bodies: dict[str, dict[str, object]] = {
        "latency": {"seconds": seconds},
        "reject-sends": {"condition": condition},
        "drop-dispositions": {"count": count},
        "relay-no-listener": {"path": path, "on": not off},
    }
    request = urllib.request.Request(
        f"{control_url.rstrip('/')}/namespaces/{namespace}/faults/{action}",
        data=json.dumps(bodies.get(action, {})).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {control_token or ''}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            state = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc)
        except ValueError:
            message = str(exc)
        console.print(f"error: {message}", style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
    except (urllib.error.URLError, OSError) as exc:
        console.print(
            f"[red]error[/]: no emulator answers at {control_url} ({exc}); "
            "start one with `georep emulator`."
        )
        raise typer.Exit(1) from None
    console.print(f"{namespace}: {action} -> {state}")


@app.command()
def demo(
    mode: Annotated[str, typer.Option(help="passive | active | paired.")] = "passive",
    messages: Annotated[int, typer.Option(min=1, help="Logical messages to send.")] = 3000,
    rate: Annotated[float, typer.Option(min=0, help="Messages per second (0: flat out).")] = 150.0,
    outage_at: Annotated[
        float, typer.Option(min=0, help="Seconds into the run when the primary goes down.")
    ] = 6.0,
    outage_for: Annotated[float, typer.Option(min=0.1, help="Seconds the outage lasts.")] = 6.0,
    receivers: Annotated[int, typer.Option(min=1, help="Receivers sharing the seen-set.")] = 2,
    primary: Annotated[
        str | None,
        typer.Option(
            envvar="GEOREP_PRIMARY",
            help="Real primary namespace (connection string).",
            show_default=False,
        ),
    ] = None,
    secondary: Annotated[
        str | None,
        typer.Option(
            envvar="GEOREP_SECONDARY", help="Real secondary namespace.", show_default=False
        ),
    ] = None,
    queue: Annotated[str, typer.Option(help="Queue name (must exist in real namespaces).")] = (
        "orders"
    ),
    redis_url: Annotated[
        str | None,
        typer.Option(envvar="REDIS_URL", help="Redis for the seen-set.", show_default=False),
    ] = None,
    work_dir: Annotated[
        Path | None, typer.Option(help="Where the ledger, outbox and report go (default: temp).")
    ] = None,
) -> None:
    """Replication end to end: two regions, an outage, dedup receivers, and a Spark audit.

    Zero configuration: starts the two-region emulator and an embedded Redis (or uses
    $REDIS_URL). Exit status 1 if any acknowledged message was lost or processed twice.
    """
    from georep.cli._demo import default_work_dir, run_demo
    from georep.cli._scenario import ScenarioConfig
    from georep.exceptions import ConfigurationError

    try:
        config = ScenarioConfig(
            work_dir=work_dir or default_work_dir(),
            mode=mode,
            messages=messages,
            rate=rate,
            outage_at=outage_at,
            outage_for=outage_for,
            receivers=receivers,
            queue=queue,
            primary=primary,
            secondary=secondary,
            redis_url=redis_url,
        )
    except ConfigurationError as exc:
        console.print(f"[red]error[/]: {exc}")
        raise typer.Exit(2) from None
    raise typer.Exit(run_demo(config, console))


@app.command()
def syphon(
    primary: Annotated[
        str,
        typer.Option(
            envvar="GEOREP_PRIMARY",
            help="Primary namespace connection string (or $GEOREP_PRIMARY).",
            show_default=False,
        ),
    ],
    secondary: Annotated[
        str,
        typer.Option(
            envvar="GEOREP_SECONDARY",
            help="Secondary namespace connection string, where the backlog queues are "
            "(or $GEOREP_SECONDARY).",
            show_default=False,
        ),
    ],
    primary_namespace: Annotated[
        str,
        typer.Option(
            envvar="GEOREP_PRIMARY_NAMESPACE",
            help="Name the backlog queue paths are built from (as given to ensure_backlog_queues).",
        ),
    ],
    backlog_queues: Annotated[
        int, typer.Option(envvar="GEOREP_BACKLOG_QUEUES", min=1, help="Backlog queue count.")
    ] = 10,
    long_poll: Annotated[
        float, typer.Option(envvar="GEOREP_SYPHON_LONG_POLL", help="Long poll, seconds.")
    ] = 900.0,
    retry_interval: Annotated[
        float, typer.Option(envvar="GEOREP_SYPHON_RETRY", help="Retry interval, 1-120 s.")
    ] = 1.0,
    report_every: Annotated[float, typer.Option(help="Seconds between progress lines.")] = 10.0,
) -> None:
    """Move backlog-queue messages back into the primary namespace until stopped.

    Stops gracefully on SIGINT/SIGTERM: messages in hand are moved or handed back.
    Connection strings are never printed.
    """
    import signal

    from georep import ConfigurationError, PairedNamespaceOptions, Syphon

    try:
        options = PairedNamespaceOptions(
            backlog_queue_count=backlog_queues,
            syphon_long_poll=long_poll,
            syphon_retry_interval=retry_interval,
        )
    except ConfigurationError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None

    async def run() -> None:
        worker = Syphon.from_connection_strings(
            primary, secondary, primary_namespace=primary_namespace, options=options
        )
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(worker.run())
        console.print(
            f"syphon: {backlog_queues} backlog queues of {primary_namespace}, "
            f"long poll {long_poll:g} s"
        )
        while not stop.is_set() and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), report_every)
            stats = worker.stats
            console.print(
                f"moved {stats.moved}  dead-lettered {stats.dead_lettered}  "
                f"retries {stats.retries}  receive calls {stats.receive_calls}  "
                f"billed operations {stats.billed_operations + stats.receive_calls}"
            )
        await worker.aclose()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, long_poll + 30)
        console.print("syphon stopped")

    asyncio.run(run())


@app.command()
def cost(
    rate: Annotated[float, typer.Option(min=0, help="Messages per second, all entities.")],
    size: Annotated[int, typer.Option(min=1, help="Message size in bytes.")] = 1024,
    mode: Annotated[
        list[str] | None,
        typer.Option(help="unreplicated | passive | active | paired (repeat; default all)."),
    ] = None,
    entities: Annotated[int, typer.Option(min=1, help="Queues and topics sent to.")] = 1,
    senders: Annotated[int, typer.Option(min=1, help="Sender clients (each pings).")] = 1,
    backlog_queues: Annotated[int, typer.Option(min=1, help="Paired: backlog queues.")] = 10,
    syphon_hosts: Annotated[int, typer.Option(min=0, help="Paired: syphon processes.")] = 1,
    outage_minutes: Annotated[
        float, typer.Option(min=0, help="Expected primary outage, minutes per month.")
    ] = 0.0,
    ping_interval: Annotated[float, typer.Option(help="Paired: seconds between pings.")] = 60.0,
    days: Annotated[float, typer.Option(help="Billing period in days.")] = 30.0,
    price_per_million: Annotated[
        float, typer.Option(min=0, help="Your price per million operations.")
    ] = 0.80,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Billed operations per month and their price, per replication mode, side by side."""
    import json

    from georep.cli._cost import MODES, Workload, estimate_costs
    from georep.exceptions import ConfigurationError

    try:
        workload = Workload(
            messages_per_second=rate,
            message_size_bytes=size,
            entities=entities,
            senders=senders,
            backlog_queue_count=backlog_queues,
            syphon_hosts=syphon_hosts,
            outage_minutes_per_month=outage_minutes,
            ping_primary_interval=ping_interval,
            days=days,
            price_per_million=price_per_million,
        )
        estimates = estimate_costs(workload, tuple(mode) if mode else MODES)
    except ConfigurationError as exc:
        console.print(f"[red]error[/]: {exc}")
        raise typer.Exit(2) from None
    amounts = [e.amount(price_per_million) for e in estimates]
    if as_json:
        report = {
            e.mode: {
                "message_operations": e.message_operations,
                "backlog_operations": e.backlog_operations,
                "ping_operations": e.ping_operations,
                "syphon_receive_calls": e.syphon_receive_calls,
                "total_operations": e.total_operations,
                "amount": amount,
            }
            for e, amount in zip(estimates, amounts, strict=True)
        }
        typer.echo(json.dumps(report, indent=2))
        return
    rows = {
        "message operations": [e.message_operations for e in estimates],
        "backlog operations (4 per message)": [e.backlog_operations for e in estimates],
        "pings": [e.ping_operations for e in estimates],
        "syphon receive calls": [e.syphon_receive_calls for e in estimates],
        "total operations": [e.total_operations for e in estimates],
    }
    table = Table(
        title=f"{rate:g} msg/s of {size:,} B for {days:g} days, "
        f"{outage_minutes:g} outage minutes, {price_per_million:g} per million operations"
    )
    table.add_column("")
    for estimate in estimates:
        table.add_column(estimate.mode, justify="right")
    for name, values in rows.items():
        table.add_row(name, *(f"{value:,.0f}" for value in values))
    table.add_row("amount", *(f"{amount:,.2f}" for amount in amounts))
    console.print(table)


@app.command()
def doctor(
    primary: Annotated[
        str,
        typer.Option(
            envvar="GEOREP_PRIMARY", help="Primary connection string.", show_default=False
        ),
    ],
    secondary: Annotated[
        str,
        typer.Option(
            envvar="GEOREP_SECONDARY", help="Secondary connection string.", show_default=False
        ),
    ],
    entity: Annotated[
        list[str] | None,
        typer.Option(help="Queue or topic to check (repeat; default every one found)."),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(envvar="REDIS_URL", help="The seen-set's Redis.", show_default=False),
    ] = None,
    ca_file: Annotated[
        str | None,
        typer.Option(
            envvar="GEOREP_CA_FILE",
            help="CA bundle for the management endpoint (the emulator's ca_file).",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds per network step.")] = 10.0,
) -> None:
    """Check a namespace pair (and Redis): reachable, keys accepted, entities alike in both.

    One line per check; each problem comes with its fix. Exit status 1 if any problem.
    Connection strings and passwords are never printed.
    """
    from georep._doctor import Severity

    async def run() -> list[Finding]:
        from georep.adapters.servicebus._doctor import check_namespaces

        findings = await check_namespaces(
            primary, secondary, entities=entity or (), connection_verify=ca_file, timeout=timeout
        )
        if redis_url:
            from georep.adapters.redis._doctor import check_seen_set_redis

            findings += await check_seen_set_redis(redis_url, timeout=timeout)
        return findings

    findings = asyncio.run(run())
    marks = {Severity.OK: "[green]ok[/]", Severity.WARNING: "[yellow]warning[/]",
             Severity.PROBLEM: "[red]problem[/]"}  # fmt: skip
    for finding in findings:
        console.print(f"{marks[finding.severity]:>8} {finding.subject}: {finding.message}",
                      highlight=False, soft_wrap=True)  # fmt: skip
        if finding.fix:
            console.print(f"         fix: {finding.fix}", highlight=False, soft_wrap=True)
    if not redis_url:
        console.print("[dim]redis: not checked (give --redis-url or set REDIS_URL)[/]")
    problems = sum(f.severity is Severity.PROBLEM for f in findings)
    console.print(f"{problems} problem(s)" if problems else "[green]no problems found[/]")
    raise typer.Exit(1 if problems else 0)


@app.command()
def bench(
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            help="throughput-raw | throughput-passive | throughput-active | failover | "
            "dedup (repeat; default all)."
        ),
    ] = None,
    messages: Annotated[int, typer.Option(min=100, help="Messages per scenario.")] = 5000,
    outage_for: Annotated[float, typer.Option(min=0.5, help="Failover run: outage, s.")] = 5.0,
    out: Annotated[Path, typer.Option(help="Results directory.")] = Path("benchmarks/results"),
    master: Annotated[str, typer.Option(help="Spark master for the audits.")] = "local[*]",
) -> None:
    """Benchmark scenarios on the emulator, each audited by Spark from its ledger.

    Writes OUT/<scenario>/report.json, timeline.png, latency_cdf.png and OUT/SUMMARY.md.
    Exit status 1 if any scenario lost a message or processed one twice.
    """
    from georep.cli._bench import SCENARIOS, run_bench
    from georep.cli._demo import log_to

    log_to(console)

    names = scenario or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        console.print(f"[red]error[/]: unknown scenario {', '.join(unknown)}; "
                      f"use {', '.join(SCENARIOS)}")  # fmt: skip
        raise typer.Exit(2)

    def show(name: str, report: dict[str, object]) -> None:
        console.print(f"{name}: sent {report['sent']}, processed {report['processed']}, "
                      f"lost {report['lost']}, processed twice "
                      f"{report['processed_more_than_once']} -> {out / name}")  # fmt: skip

    command = "georep bench " + " ".join(sys.argv[2:])
    reports = run_bench(names, out=out, messages=messages, outage_for=outage_for, master=master,
                        on_result=show, command=command)  # fmt: skip
    console.print(f"summary: {out / 'SUMMARY.md'}")
    bad = [n for n, r in reports.items() if r["lost"] or r["processed_more_than_once"]]
    raise typer.Exit(1 if bad else 0)


@app.command()
def audit(
    ledger_dir: Annotated[str, typer.Argument(help="Ledger directory (sends/, receives/, meta/).")],
    out: Annotated[
        str | None, typer.Option(help="Directory for report.json and the PNG plots.")
    ] = None,
    master: Annotated[
        str, typer.Option(help="Spark master URL, e.g. local[2] or spark://host:7077.")
    ] = "local[*]",
    outage: Annotated[
        list[str] | None,
        typer.Option(help="Outage window START,END (ISO 8601 UTC) to shade; repeat."),
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write timeline.png and latency_cdf.png.")] = True,
) -> None:
    """Audit a delivery ledger with Spark: loss, duplicates, latency, failovers.

    Exit status 1 when a message was lost or processed more than once; 2 on bad input
    (checked before Spark starts) or when the audit could not run.
    """
    from georep import ConfigurationError

    try:
        from georep.adapters.spark import audit as run_audit
        from georep.adapters.spark import report_table
    except ImportError as exc:
        console.print(str(exc), style="red", soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(2) from None
    windows = []
    for text in outage or []:
        start, separator, end = text.partition(",")
        if not separator:
            console.print(f"[red]--outage {text!r} must be START,END in ISO 8601 UTC[/red]")
            raise typer.Exit(2)
        windows.append((start.strip(), end.strip()))
    try:
        with console.status(f"auditing {ledger_dir} with Spark ({master}) ..."):
            report = run_audit(
                ledger_dir, out_dir=out, master=master, outage_windows=windows, plots=plots
            )
    except ConfigurationError as exc:
        console.print(str(exc), style="red", soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(2) from None
    except Exception as exc:  # exit 1 means "messages lost": a crash must not read as that
        first = (str(exc).strip().splitlines() or [""])[0]
        console.print(
            f"the audit could not run: {type(exc).__name__}: {first}",
            style="red",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
        raise typer.Exit(2) from None
    console.print(report_table(report))
    for warning in report["warnings"]:
        console.print(f"warning: {warning}", style="yellow", soft_wrap=True, markup=False)
    # Paths unwrapped, so that they can be copied and parsed.
    if "report_path" in report:
        console.print(f"report: {report['report_path']}", soft_wrap=True, highlight=False)
    for path in report.get("plots", {}).values():
        console.print(f"plot: {path}", soft_wrap=True, highlight=False)
    raise typer.Exit(1 if report["lost"] or report["processed_more_than_once"] else 0)


# ---------------------------------------------------------------------------- outbox

outbox_app = typer.Typer(
    help="Inspect a durable SQLite outbox: queued and dead-lettered entries.",
    no_args_is_help=True,
)
app.add_typer(outbox_app, name="outbox")

_OutboxPath = Annotated[Path, typer.Argument(help="The outbox file (SqliteOutbox path).")]
_EntryIds = Annotated[
    list[int] | None, typer.Option("--id", help="A dead-lettered entry's id (repeat).")
]
_All = Annotated[bool, typer.Option("--all", help="Every dead-lettered entry.")]


def _existing_outbox(path: Path) -> Any:
    """The SqliteOutbox at ``path``; exit 2 if there is no file (never create one)."""
    from georep._outbox import SqliteOutbox

    if not path.is_file():
        console.print(f"[red]error[/]: no outbox file at {path}; pass the SqliteOutbox path")
        raise typer.Exit(2)
    return SqliteOutbox(path)


def _on_outbox(path: Path, action: Callable[[Any], Awaitable[_T]]) -> _T:
    """Run ``action(outbox)`` on the file, turning georep errors into exit code 2."""
    from georep.exceptions import GeoReplicationError

    outbox = _existing_outbox(path)

    async def run() -> _T:
        async with outbox:
            return await action(outbox)

    try:
        return asyncio.run(run())
    except GeoReplicationError as exc:
        console.print(f"[red]error[/]: {exc}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None


def _chosen_ids(ids: list[int] | None, every: bool) -> list[int] | None:
    if bool(ids) == every:
        console.print("[red]error[/]: name entries with --id ID (repeat), or pass --all")
        raise typer.Exit(2)
    return None if every else list(ids or [])


@outbox_app.command("list")
def outbox_list(
    path: _OutboxPath,
    limit: Annotated[int, typer.Option(min=1, help="Most rows listed per state.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Counts and rows (oldest first) of queued and dead-lettered entries."""
    import json
    from dataclasses import asdict

    async def read(outbox: Any) -> tuple[int, int, list[Any]]:
        rows = await outbox.records(dead=False, limit=limit)
        rows += await outbox.records(dead=True, limit=limit)
        return await outbox.depth(), await outbox.dead_depth(), rows

    queued, dead, rows = _on_outbox(path, read)
    if as_json:
        document = {"queued": queued, "dead": dead, "entries": [asdict(row) for row in rows]}
        typer.echo(json.dumps(document, indent=2))
        return
    console.print(f"{queued} queued, {dead} dead-lettered", highlight=False)
    if not rows:
        return
    table = Table()
    for column in ("id", "state", "channel", "target", "bytes", "enqueued (UTC)", "attempts"):
        table.add_column(column)
    table.add_column("reason")
    for row in rows:
        table.add_row(
            str(row.entry_id),
            row.state,
            row.channel,
            row.region or "any",
            str(row.size),
            _utc(row.enqueued_at),
            str(row.attempts),
            row.reason or "",
        )
    console.print(table)


@outbox_app.command("replay")
def outbox_replay(path: _OutboxPath, entry_id: _EntryIds = None, every: _All = False) -> None:
    """Move dead-lettered entries back to the queue; the next drainer sends them."""
    import time

    ids = _chosen_ids(entry_id, every)
    count = _on_outbox(path, lambda outbox: outbox.replay(ids, now=time.time()))
    console.print(f"replayed {count} entr{'y' if count == 1 else 'ies'}", highlight=False)


@outbox_app.command("purge")
def outbox_purge(
    path: _OutboxPath,
    entry_id: _EntryIds = None,
    every: _All = False,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: the messages are lost.")] = False,
) -> None:
    """Delete dead-lettered entries for good (their messages are never sent)."""
    ids = _chosen_ids(entry_id, every)
    if not yes:
        console.print(
            "[red]error[/]: purge deletes the messages for good; add --yes to confirm "
            "(or replay them instead)"
        )
        raise typer.Exit(2)
    count = _on_outbox(path, lambda outbox: outbox.purge(ids))
    console.print(f"purged {count} entr{'y' if count == 1 else 'ies'}", highlight=False)


def _utc(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def main() -> None:
    app()
