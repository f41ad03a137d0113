"""The ``georep`` command line: one typer command per subcommand."""

from __future__ import annotations

__all__ = ["app", "main"]

import asyncio
import contextlib
import math
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the georep CLI needs typer and rich: pip install 'georep[cli]'") from exc

from georep.cli._errors import fail, print_error

if TYPE_CHECKING:
    from georep._doctor import Finding

_T = TypeVar("_T")

app = typer.Typer(
    name="georep",
    help="Keep Azure Service Bus applications running through a regional outage.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


_Names = list[str] | None
"""An option given once per name (``--queue a --queue b``)."""


def _each(help: str) -> Any:
    """The option of a :data:`_Names` parameter."""
    return typer.Option(help=help)


_PrintFormat = Annotated[
    str,
    typer.Option(
        "--print",
        help="What to print once ready: text (for people), json (one line: the emulator's "
        "description) or env (export lines for a shell: GEOREP_PRIMARY, GEOREP_SECONDARY, "
        "GEOREP_CA_FILE, GEOREP_EMULATOR_CONTROL_URL, GEOREP_EMULATOR_CONTROL_TOKEN).",
    ),
]


@app.command()
def emulator(
    namespace: Annotated[
        _Names, _each("Namespace name (repeat). Default: primary, secondary.")
    ] = None,
    port: Annotated[
        list[int] | None, typer.Option(help="Port per namespace, in order (0 = any free).")
    ] = None,
    queue: Annotated[
        _Names,
        _each(
            "Queue created in every namespace (repeat). Without any --queue, --session-queue, "
            "--topic or --hybrid-connection: the queue orders."
        ),
    ] = None,
    session_queue: Annotated[
        _Names, _each("Session-enabled queue created in every namespace (repeat).")
    ] = None,
    topic: Annotated[_Names, _each("Topic NAME[:SUB1,SUB2] created in every namespace.")] = None,
    hybrid_connection: Annotated[
        _Names, _each("Relay hybrid connection created in every namespace (repeat).")
    ] = None,
    control_port: Annotated[
        int, typer.Option(help="HTTP control endpoint port (0 = any free).")
    ] = 5710,
    control_token: Annotated[
        str | None,
        _env_option(
            "GEOREP_EMULATOR_CONTROL_TOKEN",
            "The control endpoint's token (default $GEOREP_EMULATOR_CONTROL_TOKEN, else random).",
        ),
    ] = None,
    print_as: _PrintFormat = "text",
) -> None:
    """Run the local two-region Service Bus emulator in the foreground (Ctrl-C stops it)."""
    from georep.adapters.emulator._runner import PRINT_FORMATS, run

    if print_as not in PRINT_FORMATS:
        raise fail(console, f"--print {print_as!r}: use one of {', '.join(PRINT_FORMATS)}")
    for number in [*(port or []), control_port]:
        if not 0 <= number <= 65535:
            raise fail(console, f"port {number} is not one: use 1-65535, or 0 for any free port")
    repeated = sorted({n for n in namespace or [] if (namespace or []).count(n) > 1})
    if repeated:
        raise fail(console, f"--namespace {', '.join(repeated)} given twice: name each once")
    # The queue `orders` is the zero-configuration default only: an entity of any kind
    # named means the caller says what to create (a topic `orders` must not clash with it).
    named = queue or session_queue or topic or hybrid_connection
    raise typer.Exit(
        run(
            namespaces=namespace,
            ports=port,
            queues=queue or ([] if named else ["orders"]),
            session_queues=session_queue or [],
            topics=topic or [],
            hybrid_connections=hybrid_connection or [],
            control_port=control_port,
            control_token=control_token or None,
            print_as=print_as,
        )
    )


def _env_option(envvar: str, help: str) -> Any:
    """An option read from ``envvar`` whose value (a secret or a URL) is never shown as default."""
    return typer.Option(envvar=envvar, help=help, show_default=False)


#: Each fault the CLI sends: the options it needs, and the ones it may take besides.
_FAULT_OPTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "outage": ((), ()),
    "restore": ((), ()),
    "blackhole": ((), ()),
    "latency": (("--seconds",), ()),
    "reject-sends": (("--condition",), ()),
    "drop-dispositions": ((), ("--count",)),
    "lose-settlements": ((), ("--count",)),
    "disaster": ((), ()),
    "relay-no-listener": (("--path",), ("--off",)),
    "session-lock-lost": (("--entity",), ()),
    "fragment-down": (("--entity", "--index"), ()),
    "fragment-up": (("--entity", "--index"), ()),
}
_FAULT_ACTIONS = ", ".join(_FAULT_OPTIONS)
#: Each option of ``georep fault``: the faults it is for, and what it gives them.
_FAULT_OPTION_HELP = {
    "--seconds": "For latency (needed): seconds added per response.",
    "--condition": "For reject-sends: server-busy | timeout | internal-error | quota-exceeded.",
    "--count": "For drop-dispositions: how many sends; for lose-settlements: how many "
    "settlements (default 1).",
    "--path": "For relay-no-listener (needed): the hybrid connection.",
    "--off": "For relay-no-listener: lift the fault.",
    "--entity": "For session-lock-lost and fragment-down/up (needed): the queue or topic "
    "(session-lock-lost: or topic/Subscriptions/sub).",
    "--index": "For fragment-down/up (needed): the fragment, 0-15.",
}


def _fault_option(flag: str) -> Any:
    """The option ``flag`` of ``georep fault``, with its help (typer names the flag after the
    parameter: ``count`` is ``--count``)."""
    return typer.Option(help=_FAULT_OPTION_HELP[flag])


_ControlUrl = Annotated[
    str, typer.Option(envvar="GEOREP_EMULATOR_CONTROL_URL", help="The emulator's control URL.")
]
_ControlToken = Annotated[
    str | None,
    _env_option("GEOREP_EMULATOR_CONTROL_TOKEN", "The control token `georep emulator` printed."),
]


def _fault_body(action: str, given: dict[str, Any]) -> dict[str, object]:
    """The control endpoint's body for ``action`` from the options ``given`` (None: not
    given); exit 2, naming the option, when one it needs is missing or one does not apply."""
    if action not in _FAULT_OPTIONS:
        raise fail(console, f"unknown fault {action!r}; one of {_FAULT_ACTIONS}")
    needed, optional = _FAULT_OPTIONS[action]
    missing = [name for name in needed if given[name] is None]
    if missing:
        raise fail(console, f"{action} needs {' and '.join(missing)}: {_FAULT_HINTS[action]}")
    extra = [name for name, value in given.items() if value is not None]
    extra = [name for name in extra if name not in needed and name not in optional]
    if extra:
        takes = ", ".join((*needed, *optional)) or "no option"
        raise fail(console, f"{action} takes {takes}, not {', '.join(extra)}")
    body = {name.removeprefix("--"): value for name, value in given.items() if value is not None}
    if action in ("drop-dispositions", "lose-settlements"):
        body.setdefault("count", 1)
    if action == "relay-no-listener":
        body = {"path": given["--path"], "on": not given["--off"]}
    return body


_FAULT_HINTS = {
    "latency": "the seconds added before every response, e.g. --seconds 0.2 (restore lifts it)",
    "reject-sends": "server-busy, timeout, internal-error or quota-exceeded (restore lifts it)",
    "relay-no-listener": "the hybrid connection, e.g. --path svc (--off lifts it)",
    "session-lock-lost": "the session-enabled queue or topic/Subscriptions/sub",
    "fragment-down": "the partitioned queue or topic and the fragment, e.g. --entity orders "
    "--index 3",
    "fragment-up": "the partitioned queue or topic and the fragment, e.g. --entity orders "
    "--index 3",
}


@app.command()
def fault(
    namespace: Annotated[str, typer.Argument(help="Namespace to act on, e.g. primary.")],
    action: Annotated[str, typer.Argument(help=_FAULT_ACTIONS)],
    seconds: Annotated[float | None, _fault_option("--seconds")] = None,
    condition: Annotated[str | None, _fault_option("--condition")] = None,
    count: Annotated[int | None, _fault_option("--count")] = None,
    path: Annotated[str | None, _fault_option("--path")] = None,
    off: Annotated[bool, _fault_option("--off")] = False,
    entity: Annotated[str | None, _fault_option("--entity")] = None,
    index: Annotated[int | None, _fault_option("--index")] = None,
    control_url: _ControlUrl = "http://127.0.0.1:5710",
    control_token: _ControlToken = None,
) -> None:
    """Inject a fault into a running emulator (`georep emulator`) through its control endpoint.

    Every option a fault needs is checked before the emulator is contacted (exit 2).
    """
    given: dict[str, Any] = {
        "--seconds": seconds,
        "--condition": condition,
        "--count": count,
        "--path": path,
        "--off": True if off else None,
        "--entity": entity,
        "--index": index,
    }
    if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
        raise fail(console, f"--seconds {seconds}: give a finite number of seconds, 0 or more")
    if not control_url.startswith(("http://", "https://")):
        raise fail(
            console,
            f"--control-url {control_url!r} is not an http:// URL: give the one "
            "`georep emulator` prints (e.g. http://127.0.0.1:5710)",
        )
    body = _fault_body(action, given)
    url = f"{control_url.rstrip('/')}/namespaces/{namespace}/faults/{action}"
    state = _post_fault(url, body, control_url, control_token)
    console.print(f"{namespace}: {action} -> {state}")


def _post_fault(
    url: str, body: dict[str, object], control_url: str, control_token: str | None
) -> object:
    """POST ``body`` to the emulator's fault ``url``; exit 2 on a refusal, 1 if none answers."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {control_token or ''}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc)
        except ValueError:
            message = str(exc)
        raise fail(console, str(message)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise fail(
            console,
            f"no emulator answers at {control_url} ({exc}); start one with `georep emulator`.",
            status=1,
        ) from None


_DemoOutageAt = Annotated[
    float, typer.Option(min=0, help="Seconds into the run when the primary goes down.")
]
_DemoPrimary = Annotated[
    str | None, _env_option("GEOREP_PRIMARY", "Real primary namespace (connection string).")
]
_DemoSecondary = Annotated[str | None, _env_option("GEOREP_SECONDARY", "Real secondary namespace.")]
_DemoQueue = Annotated[str, typer.Option(help="Queue name (must exist in real namespaces).")]
_DemoWorkDir = Annotated[
    Path | None, typer.Option(help="Where the ledger, outbox and report go (default: temp).")
]


@app.command()
def demo(
    mode: Annotated[str, typer.Option(help="passive | active | paired.")] = "passive",
    messages: Annotated[int, typer.Option(min=1, help="Logical messages to send.")] = 3000,
    rate: Annotated[float, typer.Option(min=0, help="Messages per second (0: flat out).")] = 150.0,
    outage_at: _DemoOutageAt = 6.0,
    outage_for: Annotated[float, typer.Option(min=0.1, help="Seconds the outage lasts.")] = 6.0,
    receivers: Annotated[int, typer.Option(min=1, help="Receivers sharing the seen-set.")] = 2,
    primary: _DemoPrimary = None,
    secondary: _DemoSecondary = None,
    queue: _DemoQueue = "orders",
    redis_url: Annotated[str | None, _env_option("REDIS_URL", "Redis for the seen-set.")] = None,
    work_dir: _DemoWorkDir = None,
    sessions: Annotated[
        bool,
        typer.Option(
            "--sessions",
            help="Send over sessions of a session queue; receivers keep each session's order.",
        ),
    ] = False,
    session_count: Annotated[
        int, typer.Option(min=1, help="Sessions the messages go round-robin over (--sessions).")
    ] = 50,
    audit: Annotated[
        str,
        typer.Option(
            help="spark | pyarrow: audit the ledger with Spark, or with the single-machine "
            "reference audit (same report and plots, no Java)."
        ),
    ] = "spark",
    pipeline: Annotated[
        bool,
        typer.Option(
            "--pipeline",
            help="Read with a Spark streaming query into a Parquet table (its driver killed "
            "and restarted partway) and audit the table.",
        ),
    ] = False,
) -> None:
    """Replication end to end: two regions, an outage, dedup receivers, and a Spark audit.

    Zero configuration: starts the two-region emulator and an embedded Redis (or uses
    $REDIS_URL). Exit status 1 if any acknowledged message was lost or processed twice.
    """
    from georep.cli._demo import AUDIT_ENGINES, default_work_dir, run_demo
    from georep.cli._scenario import ScenarioConfig
    from georep.exceptions import ConfigurationError

    try:
        if audit not in AUDIT_ENGINES:
            raise ConfigurationError(
                f"--audit {audit!r} is not an audit engine: use one of {', '.join(AUDIT_ENGINES)}"
            )
        from georep._endpoint import check_connection_string

        for given, region in ((primary, "primary"), (secondary, "secondary")):
            if given is not None:
                check_connection_string(given, region)
        if work_dir is not None and work_dir.exists() and not work_dir.is_dir():
            raise ConfigurationError(
                f"--work-dir {work_dir} is a file: give a directory (made if missing)"
            )
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
            sessions=session_count if sessions else 0,
            pipeline=pipeline,
        )
    except ConfigurationError as exc:
        raise fail(console, str(exc)) from None
    raise typer.Exit(run_demo(config, console, audit=audit))


_SyphonPrimary = Annotated[
    str,
    _env_option("GEOREP_PRIMARY", "Primary namespace connection string (or $GEOREP_PRIMARY)."),
]
_SyphonSecondary = Annotated[
    str,
    _env_option(
        "GEOREP_SECONDARY",
        "Secondary namespace connection string, where the backlog queues are "
        "(or $GEOREP_SECONDARY).",
    ),
]
_SyphonNamespace = Annotated[
    str,
    typer.Option(
        envvar="GEOREP_PRIMARY_NAMESPACE",
        help="Name the backlog queue paths are built from (as given to ensure_backlog_queues).",
    ),
]
_SyphonQueues = Annotated[
    int, typer.Option(envvar="GEOREP_BACKLOG_QUEUES", min=1, help="Backlog queue count.")
]
_SyphonLongPoll = Annotated[
    float, typer.Option(envvar="GEOREP_SYPHON_LONG_POLL", help="Long poll, seconds.")
]
_SyphonRetry = Annotated[
    float, typer.Option(envvar="GEOREP_SYPHON_RETRY", help="Retry interval, 1-120 s.")
]


@app.command()
def syphon(
    primary: _SyphonPrimary,
    secondary: _SyphonSecondary,
    primary_namespace: _SyphonNamespace,
    backlog_queues: _SyphonQueues = 10,
    long_poll: _SyphonLongPoll = 900.0,
    retry_interval: _SyphonRetry = 1.0,
    report_every: Annotated[float, typer.Option(help="Seconds between progress lines.")] = 10.0,
) -> None:
    """Move backlog-queue messages back into the primary namespace until stopped.

    Stops gracefully on SIGINT/SIGTERM: messages in hand are moved or handed back.
    Connection strings are never printed.
    """
    from georep import ConfigurationError, PairedNamespaceOptions, Syphon

    try:
        options = PairedNamespaceOptions(
            backlog_queue_count=backlog_queues,
            syphon_long_poll=long_poll,
            syphon_retry_interval=retry_interval,
        )
    except ConfigurationError as exc:
        raise fail(console, str(exc)) from None

    async def run() -> None:
        worker = Syphon.from_connection_strings(
            primary, secondary, primary_namespace=primary_namespace, options=options
        )
        console.print(
            f"syphon: {backlog_queues} backlog queues of {primary_namespace}, "
            f"long poll {long_poll:g} s"
        )
        await _run_syphon(worker, report_every=report_every, long_poll=long_poll)

    asyncio.run(run())


async def _run_syphon(worker: Any, *, report_every: float, long_poll: float) -> None:
    """Run ``worker`` until SIGINT/SIGTERM, printing its stats every ``report_every`` s."""
    from georep._lifecycle import finish_task, wait_within
    from georep._signals import stop_on_signals

    stop = asyncio.Event()

    def report() -> None:
        stats = worker.stats
        console.print(
            f"moved {stats.moved}  dead-lettered {stats.dead_lettered}  "
            f"retries {stats.retries}  receive calls {stats.receive_calls}  "
            f"billed operations {stats.billed_operations + stats.receive_calls}"
        )

    with stop_on_signals(stop):
        task = asyncio.create_task(worker.run())
        while not stop.is_set() and not task.done():
            with contextlib.suppress(TimeoutError):
                await wait_within(stop.wait(), report_every)
            if not stop.is_set():
                report()
        await worker.aclose()
        await finish_task(task, timeout=long_poll + 30)
    report()  # the final figures: a move in flight at the signal has finished by now
    console.print("syphon stopped")


_CostModes = Annotated[
    list[str] | None,
    typer.Option(help="unreplicated | passive | active | paired (repeat; default all)."),
]
_CostOutage = Annotated[
    float, typer.Option(min=0, help="Expected primary outage, minutes per month.")
]
_CostPrice = Annotated[float, typer.Option(min=0, help="Your price per million operations.")]
_CostJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
_COST_ROWS = {  # table row -> CostEstimate attribute, in the order printed
    "message operations": "message_operations",
    "backlog operations (4 per message)": "backlog_operations",
    "pings": "ping_operations",
    "syphon receive calls": "syphon_receive_calls",
    "total operations": "total_operations",
}


@app.command()
def cost(
    rate: Annotated[float, typer.Option(min=0, help="Messages per second, all entities.")],
    size: Annotated[int, typer.Option(min=1, help="Message size in bytes.")] = 1024,
    mode: _CostModes = None,
    entities: Annotated[int, typer.Option(min=1, help="Queues and topics sent to.")] = 1,
    senders: Annotated[int, typer.Option(min=1, help="Sender clients (each pings).")] = 1,
    backlog_queues: Annotated[int, typer.Option(min=1, help="Paired: backlog queues.")] = 10,
    syphon_hosts: Annotated[int, typer.Option(min=0, help="Paired: syphon processes.")] = 1,
    outage_minutes: _CostOutage = 0.0,
    ping_interval: Annotated[float, typer.Option(help="Paired: seconds between pings.")] = 60.0,
    days: Annotated[float, typer.Option(help="Billing period in days.")] = 30.0,
    price_per_million: _CostPrice = 0.80,
    as_json: _CostJson = False,
) -> None:
    """Billed operations per month and their price, per replication mode, side by side."""
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
        raise fail(console, _as_options(str(exc))) from None
    if as_json:
        _echo_costs_json(estimates, price_per_million)
    else:
        title = (
            f"{rate:g} msg/s of {size:,} B for {days:g} days, "
            f"{outage_minutes:g} outage minutes, {price_per_million:g} per million operations"
        )
        _print_costs_table(estimates, price_per_million, title)


def _echo_costs_json(estimates: list[Any], price_per_million: float) -> None:
    import json

    report = {
        e.mode: {**{attr: getattr(e, attr) for attr in _COST_ROWS.values()},
                 "amount": e.amount(price_per_million)}
        for e in estimates
    }  # fmt: skip
    typer.echo(json.dumps(report, indent=2))


def _print_costs_table(estimates: list[Any], price_per_million: float, title: str) -> None:
    table = Table(title=title)
    table.add_column("")
    for estimate in estimates:
        table.add_column(estimate.mode, justify="right")
    for name, attr in _COST_ROWS.items():
        table.add_row(name, *(f"{getattr(e, attr):,.0f}" for e in estimates))
    table.add_row("amount", *(f"{e.amount(price_per_million):,.2f}" for e in estimates))
    console.print(table)


_DoctorPrimary = Annotated[str, _env_option("GEOREP_PRIMARY", "Primary connection string.")]
_DoctorSecondary = Annotated[str, _env_option("GEOREP_SECONDARY", "Secondary connection string.")]
_DoctorEntities = Annotated[
    list[str] | None,
    typer.Option(help="Queue or topic to check (repeat; default every one found)."),
]
_DoctorCaFile = Annotated[
    str | None,
    typer.Option(
        envvar="GEOREP_CA_FILE",
        help="CA bundle for the management endpoint (the emulator's ca_file).",
    ),
]


_DoctorRedis = Annotated[
    str | None,
    typer.Option(
        "--redis",
        "--redis-url",  # either name, as for `georep status`
        envvar="REDIS_URL",
        show_default=False,
        help="The seen-set's Redis, e.g. redis://127.0.0.1:6379/0. Default $REDIS_URL.",
    ),
]


@app.command()
def doctor(
    primary: _DoctorPrimary,
    secondary: _DoctorSecondary,
    entity: _DoctorEntities = None,
    redis_url: _DoctorRedis = None,
    ca_file: _DoctorCaFile = None,
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
    _print_findings(findings)
    if not redis_url:
        console.print("[dim]redis: not checked (give --redis or set REDIS_URL)[/]")
    problems = sum(f.severity is Severity.PROBLEM for f in findings)
    console.print(f"{problems} problem(s)" if problems else "[green]no problems found[/]")
    raise typer.Exit(1 if problems else 0)


def _print_findings(findings: list[Finding]) -> None:
    from georep._doctor import Severity

    marks = {Severity.OK: "[green]ok[/]", Severity.WARNING: "[yellow]warning[/]",
             Severity.PROBLEM: "[red]problem[/]"}  # fmt: skip
    for finding in findings:
        console.print(f"{marks[finding.severity]:>8} {finding.subject}: {finding.message}",
                      highlight=False, soft_wrap=True)  # fmt: skip
        if finding.fix:
            console.print(f"         fix: {finding.fix}", highlight=False, soft_wrap=True)


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
        raise fail(console, f"unknown scenario {', '.join(unknown)}; use {', '.join(SCENARIOS)}")

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
        from georep.adapters.spark import audit as run_audit, report_table
    except ImportError as exc:
        print_error(console, str(exc))
        raise typer.Exit(2) from None
    windows = _outage_windows(outage or [])
    try:
        with console.status(f"auditing {ledger_dir} with Spark ({master}) ..."):
            report = run_audit(
                ledger_dir, out_dir=out, master=master, outage_windows=windows, plots=plots
            )
    except ConfigurationError as exc:
        print_error(console, str(exc))
        raise typer.Exit(2) from None
    except Exception as exc:  # exit 1 means "messages lost": a crash must not read as that
        first = (str(exc).strip().splitlines() or [""])[0]
        print_error(console, f"the audit could not run: {type(exc).__name__}: {first}")
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


def _outage_windows(texts: list[str]) -> list[tuple[str, str]]:
    """``START,END`` texts as (start, end) pairs; exit 2 on one without a comma."""
    windows = []
    for text in texts:
        start, separator, end = text.partition(",")
        if not separator:
            raise fail(console, f"--outage {text!r} must be START,END in ISO 8601 UTC")
        windows.append((start.strip(), end.strip()))
    return windows


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
    from georep.exceptions import ConfigurationError
    from georep.outbox.sqlite import SqliteOutbox, check_existing_outbox

    try:
        check_existing_outbox(path)
    except ConfigurationError as exc:
        raise fail(console, str(exc)) from None
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
        raise fail(console, str(exc)) from None


def _chosen_ids(ids: list[int] | None, every: bool) -> list[int] | None:
    if bool(ids) == every:
        raise fail(console, "name entries with --id ID (repeat), or pass --all")
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
        raise fail(
            console, "purge deletes the messages for good; add --yes to confirm (or replay them)"
        )
    count = _on_outbox(path, lambda outbox: outbox.purge(ids))
    console.print(f"purged {count} entr{'y' if count == 1 else 'ies'}", highlight=False)


def _utc(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


# ----------------------------------------------------------------------------- roles

from georep.cli import _roles, _soak, _status  # noqa: E402 (the commands register after the app)

app.command()(_status.status)
app.command()(_roles.failover)
app.command()(_roles.failback)
app.command()(_roles.pin)
app.command()(_roles.unpin)
app.command()(_roles.forget)
app.command()(_soak.soak)


#: The cost command's options by the Workload field each sets: an error names the option.
_COST_OPTIONS: Final = {
    "Workload.messages_per_second": "--rate",
    "Workload.message_size_bytes": "--size",
    "Workload.entities": "--entities",
    "Workload.senders": "--senders",
    "Workload.backlog_queue_count": "--backlog-queues",
    "Workload.syphon_hosts": "--syphon-hosts",
    "Workload.outage_minutes_per_month": "--outage-minutes",
    "Workload.ping_primary_interval": "--ping-interval",
    "Workload.days": "--days",
    "Workload.price_per_million": "--price-per-million",
}


def _as_options(message: str) -> str:
    """``message`` with each Workload field named by the option that sets it."""
    for field, option in _COST_OPTIONS.items():
        message = message.replace(field, option)
    return message


def main() -> None:
    """The console entry point: a command's bad input that reaches the library
    (``ConfigurationError``: a malformed value, a name that cannot be one) is one line on
    stderr and exit status 2, as the commands' own checks are, not a traceback."""
    from georep._secrets import mask_secrets
    from georep.exceptions import ConfigurationError

    try:
        app()
    except ConfigurationError as exc:
        print_error(Console(stderr=True), f"error: {mask_secrets(str(exc))}")
        raise SystemExit(2) from None
