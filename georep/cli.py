"""The ``georep`` command line."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the georep CLI needs typer and rich: pip install 'georep[cli]'") from exc

__all__ = ["app", "main"]

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
    control_port: Annotated[
        int, typer.Option(help="HTTP control endpoint port (0 = any free).")
    ] = 5710,
) -> None:
    """Run the local two-region Service Bus emulator in the foreground (Ctrl-C stops it)."""
    from georep.adapters.emulator._runner import main as run

    argv: list[str] = ["--control-port", str(control_port)]
    for name in namespace or []:
        argv += ["--namespace", name]
    for number in port or []:
        argv += ["--port", str(number)]
    for name in queue or ["orders"]:
        argv += ["--queue", name]
    for name in topic or []:
        argv += ["--topic", name]
    raise typer.Exit(run(argv))


@app.command()
def fault(
    namespace: Annotated[str, typer.Argument(help="Namespace to act on, e.g. primary.")],
    action: Annotated[
        str,
        typer.Argument(
            help="outage, restore, blackhole, latency, reject-sends, drop-dispositions, disaster"
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
    control_url: Annotated[
        str, typer.Option(envvar="GEOREP_EMULATOR_CONTROL_URL", help="The emulator's control URL.")
    ] = "http://127.0.0.1:5710",
) -> None:
    """Inject a fault into a running emulator (`georep emulator`) through its control endpoint."""
    import json
    import urllib.error
    import urllib.request

    bodies: dict[str, dict[str, object]] = {
        "latency": {"seconds": seconds},
        "reject-sends": {"condition": condition},
        "drop-dispositions": {"count": count},
    }
    request = urllib.request.Request(
        f"{control_url.rstrip('/')}/namespaces/{namespace}/faults/{action}",
        data=json.dumps(bodies.get(action, {})).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            state = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        console.print(f"[red]error[/]: {json.loads(exc.read()).get('error', exc)}")
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
    messages: Annotated[int, typer.Option(min=1, help="Messages per region.")] = 2000,
) -> None:
    """Start the two-region emulator, send and receive through the real SDK in both regions."""
    raise typer.Exit(asyncio.run(_demo(messages)))


async def _demo(messages: int) -> int:
    from georep.adapters.emulator import Emulator
    from georep.adapters.servicebus._roundtrip import outage_check, round_trip

    queue = "orders"
    console.print(
        "[bold]georep demo[/]: starting a two-region Service Bus emulator on loopback ..."
    )
    async with Emulator(namespaces=("primary", "secondary"), queues=(queue,)) as emu:
        results = []
        for region in emu.namespaces:
            with console.status(
                f"{region}: sending and receiving {messages} messages through azure-servicebus"
            ):
                results.append(
                    await round_trip(region, emu.connection_string(region), queue, messages)
                )
        control = emu.namespace("primary")
        with console.status("primary: outage, then restore"):
            outage = await outage_check(
                "primary",
                emu.connection_string("primary"),
                queue,
                outage=control.outage,
                restore=control.restore,
                stored=lambda: control.message_count(queue),
            )
    table = Table(title="Round trip per region (real azure-servicebus SDK, local emulator)")
    for column in (
        "region",
        "sent",
        "received",
        "lost",
        "duplicates",
        "send msg/s",
        "receive+complete msg/s",
    ):
        table.add_column(column, justify="right" if column != "region" else "left")
    for r in results:
        table.add_row(
            r.region, str(r.sent), str(r.received), str(r.lost), str(r.duplicates),
            f"{r.send_rate:,.0f}", f"{r.receive_rate:,.0f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"Outage on primary: the send failed with [bold]{outage.error_during_outage}[/]; "
        f"stored messages {outage.stored_before} before, "
        f"{outage.stored_after_restore} after restore; "
        f"send after restore: {'ok' if outage.send_after_restore_ok else 'FAILED'}."
    )
    healthy = (
        all(r.lost == 0 and r.duplicates == 0 for r in results)
        and outage.stored_before == outage.stored_after_restore
        and outage.send_after_restore_ok
        and outage.error_during_outage != "none (unexpected)"
    )
    console.print(
        "[green]OK[/]: nothing lost, nothing duplicated." if healthy else "[red]FAILED[/]"
    )
    return 0 if healthy else 1


def main() -> None:
    app()


if __name__ == "__main__":
    main()


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

    Exit status 1 when a message was lost or processed more than once, 2 on bad input.
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
    console.print(report_table(report))
    for warning in report["warnings"]:
        console.print(f"warning: {warning}", style="yellow", soft_wrap=True, markup=False)
    # Paths unwrapped, so that they can be copied and parsed.
    if "report_path" in report:
        console.print(f"report: {report['report_path']}", soft_wrap=True, highlight=False)
    for path in report.get("plots", {}).values():
        console.print(f"plot: {path}", soft_wrap=True, highlight=False)
    raise typer.Exit(1 if report["lost"] or report["processed_more_than_once"] else 0)
