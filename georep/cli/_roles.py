"""``georep failover``, ``failback``, ``pin``, ``unpin`` and ``forget``: changing the shared
roles (``georep status``, in ``_status.py``, shows them).

Each talks to the application's role store in Redis (``--redis``, ``--app``); every process
of the application follows a change within its refresh interval (0.25 s by default).
"""

from __future__ import annotations

__all__ = ["failback", "failover", "forget", "pin", "unpin"]

import asyncio
import functools
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from georep.cli._errors import fail

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
    return fail(errors, message)


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


def _change(
    redis_url: str,
    app_name: str,
    command: Callable[[Any], Awaitable[list[Any]]],
    as_json: bool,
) -> None:
    from georep.roles.commands import RoleCommands

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


_Change = Callable[[Any, Sequence[str], bool], Awaitable[list[Any]]]
"""A change to the shared roles: given the ``RoleCommands``, the entities named (none: every
one) and ``--force``, it returns what it changed (``RoleChange`` each)."""


def _role_change(*, force: bool = True) -> Callable[[Callable[..., _Change]], Callable[..., None]]:
    """The typer command applying the change its decorated function returns.

    The decorated function declares only the command's own options (the region, if any) and
    returns the :data:`_Change`; the command takes, after them, the options every role change
    shares: ``--redis``, ``--app``, ``--entity`` (repeat), ``--force`` (unless ``force`` is
    False) and ``--json``. It prints each change, or them all as JSON (:func:`_change`).
    """
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=type_)
        for name, type_, default in (
            ("redis_url", _Redis, ""),
            ("app_name", _App, ""),
            ("entity", _Entities, None),
            ("force", _Force, False),
            ("as_json", _Json, False),
        )
        if force or name != "force"
    ]

    def decorate(choose: Callable[..., _Change]) -> Callable[..., None]:
        def command(
            *,
            redis_url: str,
            app_name: str,
            entity: list[str] | None,
            as_json: bool,
            force: bool = False,
            **own: Any,
        ) -> None:
            change = choose(**own)
            if any(not name.strip() for name in entity or ()):
                # An empty name would make (or change) a role record nobody sends to.
                raise _fail("--entity '' names nothing: give a queue, topic or service name")
            _change(redis_url, app_name, lambda c: change(c, entity or (), force), as_json)

        functools.update_wrapper(command, choose, updated=())
        # What typer reads: the command's own options, then the shared ones.
        own = inspect.signature(choose, eval_str=True).parameters.values()
        command.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
        return command

    return decorate


@_role_change()
def failover(
    to: Annotated[
        str, typer.Option("--to", help="The region to make active: primary | secondary.")
    ],
) -> _Change:
    """Make a region active for every process. Automatic failback leaves it so.

    Refused for an entity with no record (unless --force) and for one whose senders run
    in active mode (every message already goes to both regions).
    """
    return lambda commands, entities, force: commands.failover(to, entities, force=force)


@_role_change()
def failback() -> _Change:
    """Make the primary active again for every process."""
    return lambda commands, entities, force: commands.failback(entities, force=force)


@_role_change()
def pin(
    region: Annotated[
        str,
        typer.Option("--region", help="The region to make active and keep: primary | secondary."),
    ],
) -> _Change:
    """Make a region active and keep it so: no automatic swap until `georep unpin`."""
    return lambda commands, entities, force: commands.pin(region, entities, force=force)


@_role_change(force=False)
def unpin() -> _Change:
    """Allow automatic swaps again (the active region stays as it is)."""
    return lambda commands, entities, _: commands.unpin(entities)


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
    from georep.roles.commands import RoleCommands

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
