"""``georep status``, ``failover``, ``failback``, ``pin``, ``unpin`` and ``forget``: the
shared roles.

One command to see the state, one to change it. Each talks to the application's role
store in Redis (``--redis``, ``--app``); every process of the application follows a change
within its refresh interval (0.25 s by default).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["failback", "failover", "forget", "pin", "status", "unpin"]

_T = TypeVar("_T")
_log = logging.getLogger("georep.cli")

console = Console()
errors = Console(stderr=True)

_Redis = Annotated[
    str,
    typer.Option(
        "--redis",
        "--redis-url",  # the name `georep doctor` uses: either works everywhere
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
_Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Create the record of a named entity no process has shared yet (default: "
        "refused, as a misspelt name would be).",
    ),
]


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
        "mode": record.mode or None,
    }


# The seen-set's keys (adapters/redis/_seen.py): under ``georep:seen:GROUP:``, a hash per
# time bucket ``{tag}:<hash>:<bucket>`` whose fields are ids, the claims ``{tag}:<hash>:c``
# (ids in flight), dead-letter reasons ``:r``, ``layout``, ``state:<digest>``, and the
# previous layout's one key per id (a raw 16-byte digest). An id may sit in two buckets
# of its hash (recorded again later), so ids are counted once per hash and field.
_SEEN_HASH = re.compile(rb"^(\{[^}]*\}:\d+):(c|r|\d+)$", re.DOTALL)


async def _seen_ids(store: Any, group: str, budget: float = 1.0) -> dict[str, Any]:
    """The ids the seen-set of ``group`` holds and those claimed in flight (SCAN, at most
    ``budget`` seconds; ``complete`` False when it ran out)."""
    client = store.client
    prefix = f"georep:seen:{group}:".encode()
    pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", prefix) + b"*"
    ids: set[tuple[bytes, bytes]] = set()
    legacy_ids = in_flight = 0
    cursor, stop = 0, time.monotonic() + budget
    while True:
        cursor, keys = await client.scan(cursor=cursor, match=pattern, count=1000)
        pipe = client.pipeline(transaction=False)
        reads: list[tuple[str, bytes]] = []
        for key in keys:
            rest = key[len(prefix) :]
            found = _SEEN_HASH.match(rest)
            if found is not None and found.group(2) == b"c":
                pipe.hlen(key)
                reads.append(("claims", b""))
            elif found is not None and found.group(2) != b"r":
                pipe.hkeys(key)
                reads.append(("bucket", found.group(1)))
            elif found is None and rest != b"layout" and not rest.startswith(b"state:"):
                pipe.get(key)
                reads.append(("legacy", b""))
        answers = await pipe.execute() if reads else []
        for (kind, base), answer in zip(reads, answers, strict=True):
            if kind == "claims":
                in_flight += int(answer)
            elif kind == "bucket":
                ids.update((base, field) for field in answer)
            elif answer is not None:  # a previous-layout key: 'c' + owner is a claim
                if answer.startswith(b"c"):
                    in_flight += 1
                else:
                    legacy_ids += 1
        if cursor == 0:
            complete = True
            break
        if time.monotonic() > stop:
            complete = False
            break
    return {
        "group": group,
        "ids": len(ids) + legacy_ids,
        "in_flight": in_flight,
        "complete": complete,
    }


_Outbox = Annotated[
    Path | None, typer.Option(help="A SqliteOutbox file: show how many messages wait.")
]
_SeenGroup = Annotated[
    str | None,
    typer.Option(help="A seen-set group: count the ids it holds (SCAN, 1 s at most)."),
]
_Backlog = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="Paired namespaces: the secondary's connection string; shows each backlog "
        "queue's depth, i.e. what the syphon has still to move. Needs --primary-namespace; "
        "with --primary-namespace alone, $GEOREP_SECONDARY is used (and said so).",
    ),
]
_PrimaryNamespace = Annotated[
    str | None,
    typer.Option(
        help="Paired namespaces: the name the backlog queues are built from; shows their "
        "depths (the secondary from --backlog, else $GEOREP_SECONDARY)."
    ),
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

    backlog_source = _backlog_source(backlog, primary_namespace)

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
            report["seen"] = await _seen_ids(store, seen_group)
        return report

    report = _run(redis_url, app_name, read)
    if outbox is not None:
        report["outbox_depth"] = _outbox_depth(outbox)
    if backlog_source is not None:
        connection_string, source = backlog_source
        report["backlog"] = _backlog_depths(
            connection_string, str(primary_namespace), backlog_queues, ca_file, source
        )
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_status(report)


def _backlog_source(backlog: str | None, primary_namespace: str | None) -> tuple[str, str] | None:
    """The secondary's connection string for the backlog depths and where it came from;
    None when no depth was asked for. Checked before anything is read."""
    if backlog is not None:
        if not primary_namespace:
            raise _fail(
                "--backlog needs --primary-namespace (the name the backlog queues are built "
                "from, as given to ensure_backlog_queues)"
            )
        connection_string, source = backlog, "--backlog"
    elif not primary_namespace:
        return None
    else:
        connection_string, source = os.environ.get("GEOREP_SECONDARY", ""), "$GEOREP_SECONDARY"
        if not connection_string:
            raise _fail(
                "--primary-namespace shows the backlog queues' depths and needs the "
                "secondary's connection string: pass --backlog, or set $GEOREP_SECONDARY"
            )
        errors.print(
            "backlog: the secondary's connection string comes from $GEOREP_SECONDARY",
            style="dim",
            highlight=False,
            markup=False,
        )
    from azure.servicebus import parse_connection_string

    try:
        parse_connection_string(connection_string)
    except ValueError as exc:  # its text names what is missing, never the key
        raise _fail(f"the connection string in {source} is malformed: {exc}") from None
    return connection_string, source


def _backlog_depths(
    connection_string: str,
    primary_namespace: str,
    count: int,
    ca_file: str | None,
    source: str = "--backlog",
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
            f"the connection string in {source} is malformed (check Endpoint and the key)"
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
        columns = ("entity", "mode", "active", "generation", "since", "pinned", "changed by")
        for column in columns:
            table.add_column(column)
        for name, record in entities.items():
            if record is None:
                table.add_row(name, "-", "-", "-", "-", "-", "no record")
                continue
            since = datetime.fromisoformat(record["since"]).timestamp()
            active_mode = record["mode"] == "active"
            table.add_row(
                name,
                record["mode"] or "-",
                "both (active mode)" if active_mode else record["active"],
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
    if "seen" in report:
        seen = report["seen"]
        at_least = "" if seen["complete"] else "at least "
        console.print(
            f"seen-set {seen['group']}: {at_least}{seen['ids']} ids held, "
            f"{at_least}{seen['in_flight']} in flight (claimed)",
            highlight=False,
            markup=False,
        )


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
                "skipped": change.skipped or None,
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
        if change.skipped:
            console.print(
                f"{change.entity}: skipped, {change.skipped}", highlight=False, markup=False
            )
        elif change.changed:
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
    force: _Force = False,
    as_json: _Json = False,
) -> None:
    """Make a region active for every process. Automatic failback leaves it so.

    Refused for an entity with no record (unless --force) and for one whose senders run
    in active mode (every message already goes to both regions).
    """
    _change(redis_url, app_name, lambda c: c.failover(to, entity or (), force=force), as_json)


def failback(
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    force: _Force = False,
    as_json: _Json = False,
) -> None:
    """Make the primary active again for every process."""
    _change(redis_url, app_name, lambda c: c.failback(entity or (), force=force), as_json)


def pin(
    region: Annotated[
        str,
        typer.Option("--region", help="The region to make active and keep: primary | secondary."),
    ],
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    force: _Force = False,
    as_json: _Json = False,
) -> None:
    """Make a region active and keep it so: no automatic swap until `georep unpin`."""
    _change(redis_url, app_name, lambda c: c.pin(region, entity or (), force=force), as_json)


def unpin(
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    as_json: _Json = False,
) -> None:
    """Allow automatic swaps again (the active region stays as it is)."""
    _change(redis_url, app_name, lambda c: c.unpin(entity or ()), as_json)


def forget(
    entity: Annotated[
        list[str] | None,
        typer.Option("--entity", help="The entity whose role record to delete (repeat)."),
    ] = None,
    redis_url: _Redis = "",
    app_name: _App = "",
    as_json: _Json = False,
) -> None:
    """Delete entities' role records (one made by mistake, or left by old senders).

    A process still sharing an entity's roles creates its record again from its own roles
    within 1 s; an entity no process uses stays gone.
    """
    from georep._role_commands import RoleCommands

    if not entity:
        raise _fail("name the entities whose records to delete with --entity (repeat)")
    forgotten = _run(
        redis_url, app_name, lambda store: RoleCommands(store, app=app_name).forget(entity)
    )
    if as_json:
        document = {
            name: None if before is None else _record_json(before)
            for name, before in forgotten.items()
        }
        typer.echo(json.dumps(document, indent=2))
        return
    for name, before in forgotten.items():
        if before is None:
            console.print(f"{name}: no role record: nothing deleted", highlight=False, markup=False)
            continue
        console.print(
            f"{name}: role record deleted (was {before.active} active, generation "
            f"{before.generation}, by {before.changed_by}); a process still sharing its "
            "roles creates it again within 1 s",
            highlight=False,
            markup=False,
        )
