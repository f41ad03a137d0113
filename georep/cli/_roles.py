"""``georep status``, ``failover``, ``failback``, ``pin`` and ``unpin``: the shared roles.

One command to see the state, one to change it. Each talks to the application's role
store in Redis (``--redis``, ``--app``); every process of the application follows a change
within its refresh interval (0.25 s by default).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["failback", "failover", "pin", "status", "unpin"]

_T = TypeVar("_T")
_log = logging.getLogger("georep.cli")

console = Console()
errors = Console(stderr=True)

_Redis = Annotated[
    str,
    typer.Option(
        "--redis",
        envvar="REDIS_URL",
        help="The application's Redis (the receivers' seen-set store), e.g. "
        "redis://127.0.0.1:6379/0. Default $REDIS_URL.",
        show_default=False,
    ),
]
_App = Annotated[
    str,
    typer.Option(
        "--app",
        envvar="GEOREP_APP",
        help="The application's name, as its senders give RedisRoleStore(app=...). "
        "Default $GEOREP_APP.",
        show_default=False,
    ),
]
_Entities = Annotated[
    list[str] | None,
    typer.Option("--entity", help="A queue, topic or service (repeat). Default: every one."),
]
_Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _fail(message: str) -> typer.Exit:
    errors.print(f"error: {message}", style="red", soft_wrap=True, highlight=False, markup=False)
    return typer.Exit(2)


def _run(redis_url: str, app_name: str, action: Callable[[Any], Awaitable[_T]]) -> _T:
    """``action(store)`` on the application's Redis role store; exit 2 on a georep error."""
    from georep.exceptions import ConfigurationError, StoreUnavailableError

    if not redis_url:
        raise _fail("no Redis given: pass --redis redis://HOST:6379/0 or set $REDIS_URL")
    if not app_name:
        raise _fail("no application named: pass --app NAME or set $GEOREP_APP")
    # The change is printed below; the library's log line would say it twice on stderr.
    logging.getLogger("georep.roles").addHandler(logging.NullHandler())

    async def run() -> _T:
        from georep.adapters.redis import RedisRoleStore

        store = RedisRoleStore.from_url(redis_url, app=app_name, operation_timeout=2.0)
        async with store:
            return await action(store)

    try:
        return asyncio.run(run())
    except StoreUnavailableError as exc:
        raise _fail(f"{exc}; fix: start Redis or pass the right --redis URL") from None
    except ConfigurationError as exc:
        raise _fail(str(exc)) from None
    except ValueError as exc:  # a malformed URL, from redis-py
        raise _fail(f"--redis: {exc}") from None


def _when(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{moment} ({max(0.0, time.time() - seconds):.0f} s ago)"


def _record_json(record: Any) -> dict[str, Any]:
    return {
        "active": record.active,
        "generation": record.generation,
        "since": datetime.fromtimestamp(record.since, UTC).isoformat(),
        "pinned": record.pinned,
        "automatic": record.automatic,
        "changed_by": record.changed_by,
    }


async def _seen_keys(store: Any, group: str, budget: float = 1.0) -> tuple[int, bool]:
    """Seen-set keys of ``group`` (SCAN, at most ``budget`` seconds): (count, complete)."""
    client = store.client
    pattern = f"georep:seen:{group}:*"
    count, cursor, stop = 0, 0, time.monotonic() + budget
    while True:
        cursor, keys = await client.scan(cursor=cursor, match=pattern, count=1000)
        count += len(keys)
        if cursor == 0:
            return count, True
        if time.monotonic() > stop:
            return count, False


_Outbox = Annotated[
    Path | None, typer.Option(help="A SqliteOutbox file: show how many messages wait.")
]
_SeenGroup = Annotated[
    str | None, typer.Option(help="A seen-set group: count its keys (SCAN, 1 s at most).")
]
_Backlog = Annotated[
    str | None,
    typer.Option(
        envvar="GEOREP_SECONDARY",
        show_default=False,
        help="Paired namespaces: the secondary's connection string (or GEOREP_SECONDARY); "
        "shows each backlog queue's depth, i.e. what the syphon has still to move.",
    ),
]
_PrimaryNamespace = Annotated[
    str | None,
    typer.Option(help="Paired namespaces: the name the backlog queues are built from."),
]
_BacklogQueues = Annotated[int, typer.Option(min=1, help="Backlog queue count.")]
_CaFile = Annotated[
    str | None,
    typer.Option(envvar="GEOREP_CA_FILE", help="CA bundle for the management endpoint."),
]


def status(
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    outbox: _Outbox = None,
    seen_group: _SeenGroup = None,
    backlog: _Backlog = None,
    primary_namespace: _PrimaryNamespace = None,
    backlog_queues: _BacklogQueues = 10,
    ca_file: _CaFile = None,
    as_json: _Json = False,
) -> None:
    """The roles of every entity: active region, generation, since when, pinned, by whom."""
    from georep._role_commands import RoleCommands

    async def read(store: Any) -> dict[str, Any]:
        records = await RoleCommands(store, app=app_name).status(entity or ())
        report: dict[str, Any] = {
            "app": app_name,
            "entities": {
                name: None if record is None else _record_json(record)
                for name, record in records.items()
            },
        }
        if seen_group is not None:
            count, complete = await _seen_keys(store, seen_group)
            report["seen_keys"] = {"group": seen_group, "count": count, "complete": complete}
        return report

    report = _run(redis_url, app_name, read)
    if outbox is not None:
        report["outbox_depth"] = _outbox_depth(outbox)
    if backlog is not None:
        if not primary_namespace:
            raise _fail("--backlog needs --primary-namespace (the name the backlog queues use)")
        report["backlog"] = _backlog_depths(
            backlog, str(primary_namespace), backlog_queues, ca_file
        )
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_status(report)


def _backlog_depths(
    connection_string: str, primary_namespace: str, count: int, ca_file: str | None
) -> dict[str, Any]:
    """Active messages per backlog queue, read through the management API."""
    from azure.servicebus.management import ServiceBusAdministrationClient

    from georep._paired import backlog_queue_path

    depths: dict[str, int | None] = {}
    try:
        admin = ServiceBusAdministrationClient.from_connection_string(
            connection_string, connection_verify=ca_file
        )
    except ValueError:
        raise _fail(
            "the --backlog connection string is malformed (check Endpoint and the key)"
        ) from None
    with admin:
        for index in range(count):
            path = backlog_queue_path(primary_namespace, index)
            try:
                runtime = admin.get_queue_runtime_properties(path)
            except Exception as exc:  # one unreadable queue must not hide the others
                _log.warning("backlog queue %s: %s", path, type(exc).__name__)
                depths[path] = None
                continue
            depths[path] = (runtime.active_message_count or 0) + (
                runtime.scheduled_message_count or 0
            )
    known = [d for d in depths.values() if d is not None]
    return {"queues": depths, "waiting": sum(known), "unreadable": len(depths) - len(known)}


def _outbox_depth(path: Path) -> int:
    from georep._outbox import SqliteOutbox

    if not path.is_file():
        raise _fail(f"no outbox file at {path}; pass the SqliteOutbox path")

    async def depth() -> int:
        async with SqliteOutbox(path) as box:
            found: int = await box.depth()
            return found

    return asyncio.run(depth())


def _print_status(report: dict[str, Any]) -> None:
    entities = report["entities"]
    if not entities:
        console.print(
            f"no shared roles for application {report['app']!r} yet: no sender with "
            "role_store=RedisRoleStore(..., app=...) has started (check --app and --redis)",
            highlight=False,
        )
    else:
        table = Table(title=f"roles of {report['app']}")
        for column in ("entity", "active", "generation", "since", "pinned", "changed by"):
            table.add_column(column)
        for name, record in entities.items():
            if record is None:
                table.add_row(name, "-", "-", "-", "-", "no record")
                continue
            since = datetime.fromisoformat(record["since"]).timestamp()
            table.add_row(
                name,
                record["active"],
                str(record["generation"]),
                _when(since),
                "yes" if record["pinned"] else "no",
                record["changed_by"],
            )
        console.print(table)
    if "outbox_depth" in report:
        console.print(f"outbox: {report['outbox_depth']} messages waiting", highlight=False)
    if "backlog" in report:
        backlog = report["backlog"]
        unreadable = f", {backlog['unreadable']} queues unreadable" if backlog["unreadable"] else ""
        state = "syphon idle: nothing to move" if not backlog["waiting"] else "syphon moving"
        console.print(
            f"backlog queues: {backlog['waiting']} messages waiting ({state}){unreadable}",
            highlight=False,
        )
    if "seen_keys" in report:
        seen = report["seen_keys"]
        at_least = "" if seen["complete"] else "at least "
        console.print(f"seen-set {seen['group']}: {at_least}{seen['count']} keys", highlight=False)


def _change(
    redis_url: str,
    app_name: str,
    command: Callable[[Any], Awaitable[list[Any]]],
    as_json: bool,
) -> None:
    from georep._role_commands import RoleCommands

    changes = _run(redis_url, app_name, lambda store: command(RoleCommands(store, app=app_name)))
    if as_json:
        document = [
            {
                "entity": change.entity,
                "changed": change.changed,
                "before": None if change.before is None else _record_json(change.before),
                "after": _record_json(change.after),
            }
            for change in changes
        ]
        typer.echo(json.dumps(document, indent=2))
        return
    for change in changes:
        after = change.after
        pinned = ", pinned" if after.pinned else ""
        if change.changed:
            console.print(
                f"{change.entity}: {after.active} active (generation {after.generation}"
                f"{pinned}), by {after.changed_by}; every process follows within 1 s",
                highlight=False,
                markup=False,
            )
        else:
            console.print(
                f"{change.entity}: already {after.active} active (generation "
                f"{after.generation}{pinned}): nothing changed",
                highlight=False,
                markup=False,
            )


def failover(
    to: Annotated[
        str, typer.Option("--to", help="The region to make active: primary | secondary.")
    ],
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    as_json: _Json = False,
) -> None:
    """Make a region active for every process. Automatic failback leaves it so."""
    _change(redis_url, app_name, lambda c: c.failover(to, entity or ()), as_json)


def failback(
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    as_json: _Json = False,
) -> None:
    """Make the primary active again for every process."""
    _change(redis_url, app_name, lambda c: c.failback(entity or ()), as_json)


def pin(
    region: Annotated[
        str,
        typer.Option("--region", help="The region to make active and keep: primary | secondary."),
    ],
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    as_json: _Json = False,
) -> None:
    """Make a region active and keep it so: no automatic swap until `georep unpin`."""
    _change(redis_url, app_name, lambda c: c.pin(region, entity or ()), as_json)


def unpin(
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    as_json: _Json = False,
) -> None:
    """Allow automatic swaps again (the active region stays as it is)."""
    _change(redis_url, app_name, lambda c: c.unpin(entity or ()), as_json)
