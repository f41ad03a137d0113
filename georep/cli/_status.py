"""``georep status``: one page for the operator. The shared roles (Redis), each region's
messages per entity (the namespaces' management endpoints), the seen-set and the receivers
holding claims in it, the outbox file and the paired backlog queues.

Each part is read only when its source is given, and a source that does not answer is
reported as such while the others are still shown (exit status 1). Connection strings,
keys and passwords are never printed.
"""

from __future__ import annotations

__all__ = ["status"]

import asyncio
import json
import logging
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from georep.cli._roles import (
    _App,
    _Entities,
    _fail,
    _Json,
    _record_json,
    _Redis,
    _when,
    console,
    errors,
)
from georep.exceptions import ConfigurationError

_log = logging.getLogger("georep.cli")

_Outbox = Annotated[
    Path | None,
    typer.Option(help="A SqliteOutbox file: show how many messages wait, and since when."),
]
_SeenGroup = Annotated[
    str | None,
    typer.Option(
        help="A seen-set group (the receivers' RedisSeenSet group): count the ids it holds "
        "and the claims in flight, per receiver (SCAN, 1 s at most)."
    ),
]
_Backlog = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="Paired namespaces: the secondary's connection string; shows each backlog "
        "queue's depth, i.e. what the syphon has still to move. Needs --primary-namespace; "
        "with --primary-namespace alone, --secondary or $GEOREP_SECONDARY is used.",
    ),
]
_PrimaryNamespace = Annotated[
    str | None,
    typer.Option(
        help="Paired namespaces: the name the backlog queues are built from; shows their "
        "depths (the secondary from --backlog, else --secondary or $GEOREP_SECONDARY)."
    ),
]
_BacklogQueues = Annotated[int, typer.Option(min=1, help="Backlog queue count.")]
_CaFile = Annotated[
    str | None,
    typer.Option(envvar="GEOREP_CA_FILE", help="CA bundle for the management endpoint."),
]
_Timeout = Annotated[
    float,
    typer.Option(
        min=0.1,
        help="Seconds each network step may take (the seen-set scan included: a scan "
        "that runs out reports 'at least').",
    ),
]


def status(
    redis_url: _Redis = "",
    app_name: _App = "",
    entity: _Entities = None,
    primary: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="The primary namespace's connection string (default $GEOREP_PRIMARY when "
            "$GEOREP_SECONDARY is set too): shows each entity's messages there. The key "
            "needs Manage rights (Listen for the age of the oldest message).",
        ),
    ] = None,
    secondary: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="The secondary namespace's connection string (default $GEOREP_SECONDARY "
            "when $GEOREP_PRIMARY is set too).",
        ),
    ] = None,
    outbox: _Outbox = None,
    seen_group: _SeenGroup = None,
    backlog: _Backlog = None,
    primary_namespace: _PrimaryNamespace = None,
    backlog_queues: _BacklogQueues = 10,
    ca_file: _CaFile = None,
    timeout: _Timeout = 5.0,
    as_json: _Json = False,
) -> None:
    """Roles, messages per region and entity, seen-set, outbox: what an operator looks at.

    Exit status 1 when a region or Redis did not answer (the rest is still shown), 2 for
    bad input or when nothing could be read.
    """
    regions = _regions(primary, secondary)
    backlog_source = _backlog_source(backlog, primary_namespace, secondary)
    if outbox is not None:
        from georep.outbox.sqlite import check_existing_outbox

        try:
            check_existing_outbox(outbox)
        except ConfigurationError as exc:
            raise _fail(str(exc)) from None
    if redis_url and not app_name:
        raise _fail("no application named: pass --app NAME or set $GEOREP_APP")
    if not redis_url and regions is None and outbox is None and backlog_source is None:
        raise _fail(
            "nothing to show: pass --redis redis://HOST:6379/0 (or set $REDIS_URL) for the "
            "roles, and/or --primary and --secondary for the messages per region"
        )
    # What the library would log about Redis is in the report already.
    logging.getLogger("georep.roles").addHandler(logging.NullHandler())

    report: dict[str, Any] = {"app": app_name or None}
    try:
        asyncio.run(
            _read(report, redis_url, app_name, entity or [], regions, seen_group, ca_file,
                  timeout, outbox)
        )  # fmt: skip
    except ConfigurationError as exc:  # an outbox, a connection string: named already
        raise _fail(str(exc)) from None
    except ValueError as exc:  # a malformed Redis URL (redis-py), or endpoint (the SDK)
        raise _fail(f"{_value_source(redis_url)}: {exc}") from None
    redis = report.get("redis")
    if redis is not None and not redis["reachable"] and regions is None and outbox is None:
        # Nothing else was asked for: the one source did not answer.
        raise _fail(f"{redis['error']}; fix: start Redis or pass the right --redis URL")
    if backlog_source is not None:
        connection_string, source = backlog_source
        report["backlog"] = _backlog_depths(
            connection_string, str(primary_namespace), backlog_queues, ca_file, source
        )
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print_status(report)
    unanswered = [r for r in report.get("regions", {}).values() if not r["reachable"]]
    if unanswered or (redis is not None and not redis["reachable"]):
        raise typer.Exit(1)


def _regions(primary: str | None, secondary: str | None) -> dict[str, str] | None:
    """Both namespaces' connection strings, or None when no region is to be read. Options
    first, then the environment (said on stderr); malformed ones are refused here."""
    given = {"primary": primary, "secondary": secondary}
    environment = {
        "primary": os.environ.get("GEOREP_PRIMARY", ""),
        "secondary": os.environ.get("GEOREP_SECONDARY", ""),
    }
    if primary is None and secondary is None:
        present = [region for region, value in environment.items() if value]
        if not present:
            return None
        if len(present) == 1:  # set for the syphon, say: not a pair to read
            _note(
                f"regions: only $GEOREP_{present[0].upper()} is set: pass --primary and "
                "--secondary (or set both variables) to see the messages per region"
            )
            return None
    strings: dict[str, str] = {}
    from_environment = []
    for region, value in given.items():
        if value is None:
            value = environment[region]
            from_environment.append(f"$GEOREP_{region.upper()}")
        if not value:
            raise _fail(
                f"the messages per region need both namespaces: pass --{region} (or set "
                f"$GEOREP_{region.upper()})"
            )
        strings[region] = value
    if from_environment:
        _note(f"regions: connection strings from {' and '.join(from_environment)}")
    from georep._endpoint import check_connection_string
    from georep.exceptions import ConfigurationError

    for region, value in strings.items():
        try:
            check_connection_string(value, region)
        except ConfigurationError as exc:  # its text names what is missing, never the key
            raise _fail(str(exc)) from None
    return strings


def _note(text: str) -> None:
    errors.print(text, style="dim", highlight=False, markup=False, soft_wrap=True)


async def _read(
    report: dict[str, Any],
    redis_url: str,
    app_name: str,
    entities: list[str],
    regions: dict[str, str] | None,
    seen_group: str | None,
    ca_file: str | None,
    timeout: float,
    outbox: Path | None,
) -> None:
    """Fill ``report`` from every source given: Redis first (its roles name the entities
    whose messages are counted), then the regions."""
    names = list(entities)
    if redis_url:
        names = (
            await _read_redis(report, redis_url, app_name, entities, seen_group, timeout) or names
        )
    if outbox is not None:
        report["outbox"] = await _outbox_report(outbox)
    if regions is not None:
        from georep.adapters.servicebus._depths import read_depths

        depths = await read_depths(regions, names, connection_verify=ca_file, timeout=timeout)
        report["regions"] = {depth.region: _region_json(depth) for depth in depths}


async def _read_redis(
    report: dict[str, Any],
    redis_url: str,
    app_name: str,
    entities: list[str],
    seen_group: str | None,
    scan_seconds: float,
) -> list[str]:
    """The roles (and seen-set) into ``report``; the entities with a record."""
    from redis.exceptions import RedisError

    from georep.adapters.redis import RedisRoleStore
    from georep.exceptions import ConfigurationError, StoreUnavailableError
    from georep.roles.commands import RoleCommands

    try:
        store = RedisRoleStore.from_url(redis_url, app=app_name, operation_timeout=2.0)
    except ConfigurationError as exc:
        raise _fail(str(exc)) from None
    connection = store.client.connection_pool.connection_kwargs
    where = connection.get("path") or (
        f"{connection.get('host', 'localhost')}:{connection.get('port', 6379)}"
    )
    redis: dict[str, Any] = {"at": where, "reachable": True, "error": None, "latency_ms": None}
    report["redis"] = redis
    async with store:
        try:
            started = time.perf_counter()
            await store.entities()  # one round trip: is it there, and how fast
            redis["latency_ms"] = round((time.perf_counter() - started) * 1000, 2)
            records = await RoleCommands(store, app=app_name).status(entities)
        except StoreUnavailableError as exc:
            redis.update(reachable=False, error=str(exc))
            return []
        report["entities"] = {
            name: None if record is None else _record_json(record)
            for name, record in records.items()
        }
        if seen_group is not None:
            try:
                report["seen"] = await _seen_ids(store, seen_group, scan_seconds)
            except (RedisError, OSError) as exc:  # it answered a moment ago
                redis.update(
                    reachable=False, error=f"the seen-set scan failed ({type(exc).__name__})"
                )
    return list(records)


def _region_json(depth: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "namespace": depth.namespace,
        "reachable": depth.reachable,
        "error": depth.error or None,
        "entities": {
            row.path: {
                "entity": row.entity,
                "found": row.found,
                "active": row.active,
                "dead_letter": row.dead_letter,
                "scheduled": row.scheduled,
                "oldest_enqueued": None
                if row.oldest_enqueued is None
                else row.oldest_enqueued.isoformat(),
                "lag_seconds": None if (lag := row.lag(now)) is None else round(lag, 1),
                "note": row.note or None,
            }
            for row in depth.entities
        },
    }


# The seen-set's keys (adapters/redis/_seen.py): under ``georep:seen:GROUP:``, a hash per
# time bucket ``{tag}:<hash>:<bucket>`` whose fields are ids, the claims ``{tag}:<hash>:c``
# (ids in flight: field -> ``deadline_ms|owner``, the deadline by Redis' clock), dead-letter
# reasons ``:r``, ``layout``, ``state:<digest>``, and the previous layout's one key per id
# (a raw 16-byte digest; a claim there is ``c`` + owner, expiring with its lease). An id may
# sit in two buckets of its hash (recorded again later), so ids are counted once per hash
# and field.
_SEEN_HASH = re.compile(rb"^(\{[^}]*\}:\d+):(c|r|\d+)$", re.DOTALL)


async def _seen_ids(store: Any, group: str, budget: float = 5.0) -> dict[str, Any]:
    """The ids the seen-set of ``group`` holds, the claims in flight and who holds them
    (SCAN, at most ``budget`` seconds; ``complete`` False when it ran out).

    A claim whose lease ran out is ``expired``: its receiver stopped renewing it (crashed,
    hung, or lost Redis) without committing or releasing it.
    """
    client = store.client
    prefix = f"georep:seen:{group}:".encode()
    pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", prefix) + b"*"
    seconds, microseconds = await client.time()
    now_ms = int(seconds) * 1000 + int(microseconds) // 1000
    ids: set[tuple[bytes, bytes]] = set()
    receivers: dict[str, dict[str, int]] = {}
    legacy_ids = 0

    def claim(owner: bytes, expired: bool) -> None:
        held = receivers.setdefault(owner.decode(errors="replace"), {"claims": 0, "expired": 0})
        held["expired" if expired else "claims"] += 1

    cursor, stop = 0, time.monotonic() + budget
    while True:
        cursor, keys = await client.scan(cursor=cursor, match=pattern, count=1000)
        pipe = client.pipeline(transaction=False)
        reads: list[tuple[str, bytes]] = []
        for key in keys:
            rest = key[len(prefix) :]
            found = _SEEN_HASH.match(rest)
            if found is not None and found.group(2) == b"c":
                pipe.hgetall(key)
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
                for value in answer.values():
                    deadline, _, owner = value.partition(b"|")
                    claim(owner, int(deadline or 0) <= now_ms)
            elif kind == "bucket":
                ids.update((base, field) for field in answer)
            elif answer is not None:  # a previous-layout key: 'c' + owner is a claim
                if answer.startswith(b"c"):
                    claim(answer[1:], False)
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
        "in_flight": sum(held["claims"] for held in receivers.values()),
        "expired_claims": sum(held["expired"] for held in receivers.values()),
        "receivers": dict(sorted(receivers.items())),
        "complete": complete,
    }


def _backlog_source(
    backlog: str | None, primary_namespace: str | None, secondary: str | None
) -> tuple[str, str] | None:
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
    elif secondary:
        connection_string, source = secondary, "--secondary"
    else:
        connection_string, source = os.environ.get("GEOREP_SECONDARY", ""), "$GEOREP_SECONDARY"
        if not connection_string:
            raise _fail(
                "--primary-namespace shows the backlog queues' depths and needs the "
                "secondary's connection string: pass --backlog or --secondary, or set "
                "$GEOREP_SECONDARY"
            )
        _note("backlog: the secondary's connection string comes from $GEOREP_SECONDARY")
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

    from georep.paired.options import backlog_queue_path

    depths: dict[str, int | None] = {}
    dead_lettered = 0
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
            dead_lettered += runtime.dead_letter_message_count or 0
    known = [d for d in depths.values() if d is not None]
    return {
        "queues": depths,
        "waiting": sum(known),
        "dead_lettered": dead_lettered,
        "unreadable": len(depths) - len(known),
    }


async def _outbox_report(path: Path) -> dict[str, Any]:
    """Queued and dead-lettered entries of a SqliteOutbox file, and the oldest queued one."""
    from georep.outbox.sqlite import SqliteOutbox

    async with SqliteOutbox(path) as outbox:
        queued, dead = await outbox.depth(), await outbox.dead_depth()
        oldest = await outbox.records(dead=False, limit=1)
    report: dict[str, Any] = {
        "path": str(path),
        "queued": queued,
        "dead": dead,
        "oldest_queued": None,
        "oldest_queued_age_seconds": None,
    }
    if oldest:
        since = oldest[0].enqueued_at
        report["oldest_queued"] = datetime.fromtimestamp(since, UTC).isoformat()
        report["oldest_queued_age_seconds"] = round(max(0.0, time.time() - since), 1)
    return report


def _print_status(report: dict[str, Any]) -> None:
    redis = report.get("redis")
    if redis is not None:
        _print_roles(report, redis)
    if "regions" in report:
        _print_regions(report["regions"])
    if "outbox" in report:
        outbox = report["outbox"]
        since = ""
        if outbox["oldest_queued_age_seconds"] is not None:
            since = f", the oldest queued {outbox['oldest_queued_age_seconds']:.0f} s ago"
        _line(f"outbox {outbox['path']}: {outbox['queued']} messages waiting{since}, "
              f"{outbox['dead']} dead-lettered")  # fmt: skip
    if "backlog" in report:
        backlog = report["backlog"]
        unreadable = f", {backlog['unreadable']} queues unreadable" if backlog["unreadable"] else ""
        state = "syphon idle: nothing to move" if not backlog["waiting"] else "syphon moving"
        dead = backlog["dead_lettered"]
        dead_text = f", {dead} dead-lettered (the syphon gave them up)" if dead else ""
        _line(
            f"backlog queues: {backlog['waiting']} messages waiting ({state}){dead_text}"
            f"{unreadable}"
        )
    if "seen" in report:
        _print_seen(report["seen"])


def _line(text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def _print_roles(report: dict[str, Any], redis: dict[str, Any]) -> None:
    if not redis["reachable"]:
        _line(f"redis {redis['at']}: UNREACHABLE: {redis['error']}; roles and seen-set unknown")
        return
    _line(f"redis {redis['at']}: answers ({redis['latency_ms']:g} ms)")
    entities = report.get("entities", {})
    if not entities:
        _line(
            f"no shared roles for application {report['app']!r} yet: no sender with "
            "role_store=RedisRoleStore(..., app=...) has started (check --app and --redis)"
        )
        return
    table = Table(title=f"roles of {report['app']}", box=box.SIMPLE_HEAD)
    for column in ("entity", "mode", "active", "generation", "since", "pinned", "changed by"):
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


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print_regions(regions: dict[str, Any]) -> None:
    table = Table(title="messages per region", box=box.SIMPLE_HEAD)
    for column in ("entity", "region", "active", "dead-lettered", "scheduled"):
        table.add_column(column, justify="left" if column in ("entity", "region") else "right")
    table.add_column("oldest waiting")
    rows = sorted(
        (path, region, row)
        for region, found in regions.items()
        for path, row in found["entities"].items()
    )
    for path, region, row in rows:
        if not row["found"]:
            table.add_row(path, region, "-", "-", "-", "no such queue or topic here")
            continue
        oldest = "-" if not row["active"] else (row["note"] or "?")
        if row["lag_seconds"] is not None:
            oldest = f"{row['lag_seconds']:.0f} s ago"
        table.add_row(
            path,
            region,
            _count(row["active"]),
            _count(row["dead_letter"]),
            _count(row["scheduled"]),
            oldest,
        )
    if rows:
        console.print(table)
    for region, found in regions.items():
        if found["reachable"]:
            _line(f"{region} {found['namespace']}: answers")
        else:
            _line(f"{region} {found['namespace']}: UNREACHABLE: {found['error']}")


def _print_seen(seen: dict[str, Any]) -> None:
    at_least = "" if seen["complete"] else "at least "
    processing = sum(1 for held in seen["receivers"].values() if held["claims"])
    _line(
        f"seen-set {seen['group']}: {at_least}{seen['ids']} ids held, "
        f"{at_least}{seen['in_flight']} in flight (claimed) by {processing} "
        f"receiver{'' if processing == 1 else 's'}, "
        f"{at_least}{seen['expired_claims']} claims expired"
    )
    for owner, held in seen["receivers"].items():
        expired = ""
        if held["expired"]:
            expired = (
                f", {held['expired']} expired (this receiver stopped renewing them: crashed, "
                "hung or cut off from Redis)"
            )
        _line(f"  receiver {owner}: {held['claims']} in flight{expired}")


def _value_source(redis_url: str | None) -> str:
    """Which option a ValueError from reading the sources came from: ``--redis`` when its
    URL does not parse, else the namespaces' connection strings."""
    if redis_url:
        from redis.connection import parse_url

        try:
            parse_url(redis_url)  # type: ignore[no-untyped-call]
        except ValueError:
            return "--redis"
    return "--primary/--secondary (a connection string's Endpoint)"
