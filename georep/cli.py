"""The ``georep`` command line."""

from __future__ import annotations

import asyncio
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
