"""What an operator does to the shared roles: fail over, fail back, pin, unpin, forget.

``georep failover``, ``failback``, ``pin``, ``unpin`` and ``forget`` (``georep.cli``) call
these on a shared :class:`georep.ports.RoleStore`. Each change is one compare-and-set in
the store, logged (who, when, what) and traced (a span ``georep {command}``); every
process follows it at its next background read of the store (``refresh_interval``, 0.25 s
by default).

Two things are refused before anything changes: an entity with no record (most often a
typo: no sender ever shared its roles; ``force=True`` creates it), and an entity whose
senders run in active mode (the record says so): they send every message to both
regions, so there is no active region to move and a "successful" failover would change
nothing they do.
"""

from __future__ import annotations

__all__ = ["REGIONS", "RoleChange", "RoleCommands", "check_region"]

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace

from georep.exceptions import ConfigurationError
from georep.ports import RoleChangeTerms, RoleRecord, RoleStore
from georep.roles.store import who_am_i

_log = logging.getLogger("georep.roles")

#: The region labels an operator names.
REGIONS: Final = ("primary", "secondary")

_ATTEMPTS: Final = 5  # compare-and-set rounds before giving up on a busy record


@dataclass(frozen=True)
class RoleChange:
    """What one command did to one entity.

    Attributes:
        entity: The entity.
        before: Its record before (None: it had none).
        after: Its record after.
        changed: False when it already was as asked, or skipped.
        skipped: Why the command left the entity alone (empty when it did not): a
            command for every entity skips those whose senders run in active mode.
    """

    entity: str
    before: RoleRecord | None
    after: RoleRecord
    changed: bool
    skipped: str = ""


#: Why an active-mode entity has no role to move (the commands' refusal and skip).
ACTIVE_MODE = (
    "its senders run in active mode: every message goes to both regions, so there is no "
    "active region to move"
)


def check_region(region: str) -> str:
    """``region`` if it is a region label.

    Raises:
        ConfigurationError: It is not ``primary`` or ``secondary``.
    """
    if region not in REGIONS:
        raise ConfigurationError(f"unknown region {region!r}: use one of {', '.join(REGIONS)}")
    return region


class RoleCommands:
    """The operator's commands on one application's shared roles.

    Args:
        store: The application's role store.
        app: The application's name (for logs and spans).
        tracer_provider: OpenTelemetry tracer provider (None: the global one).
    """

    def __init__(
        self,
        store: RoleStore,
        *,
        app: str,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        from georep import __version__

        self.store = store
        self.app = app
        self._tracer = trace.get_tracer("georep", __version__, tracer_provider)

    async def status(self, entities: Sequence[str] = ()) -> dict[str, RoleRecord | None]:
        """Each entity's record (every entity with one when none is named)."""
        names = list(entities) or await self.store.entities()
        return {name: await self.store.read(name) for name in names}

    async def failover(
        self, to: str, entities: Sequence[str] = (), *, force: bool = False
    ) -> list[RoleChange]:
        """Make ``to`` active. Without ``entities``, for every entity with a record.

        Args:
            to: The region to make active.
            entities: The entities (default: every one with a record; those whose
                senders run in active mode are skipped).
            force: Create the record of a named entity that has none (no process shared
                its roles yet): processes that start later follow it.

        Raises:
            ConfigurationError: ``to`` is not a region, no entity has a record (name one),
                a named entity has none (without ``force``), a named entity's senders run
                in active mode, or an entity is pinned to the other region (unpin it
                first). Nothing is changed then.
            StoreUnavailableError: The store cannot be reached.
        """
        return await self._apply("failover", check_region(to), None, entities, force)

    async def failback(
        self, entities: Sequence[str] = (), *, force: bool = False
    ) -> list[RoleChange]:
        """Make the primary active again (``failover`` to ``primary``)."""
        return await self._apply("failback", "primary", None, entities, force)

    async def pin(
        self, region: str, entities: Sequence[str] = (), *, force: bool = False
    ) -> list[RoleChange]:
        """Make ``region`` active and keep it so: no automatic swap until :meth:`unpin`."""
        return await self._apply("pin", check_region(region), True, entities, force)

    async def unpin(self, entities: Sequence[str] = ()) -> list[RoleChange]:
        """Allow automatic swaps again; the active region stays as it is."""
        return await self._apply("unpin", None, False, entities, False)

    async def forget(self, entities: Sequence[str]) -> dict[str, RoleRecord | None]:
        """Delete the named entities' records; each one's record before (None: it had none).

        A process still sharing an entity's roles creates its record again from its own
        roles at its next read of the store (within ``refresh_interval``); an entity no
        process uses stays gone. The way to remove a record made by mistake (``georep
        failover --force`` on a misspelt name) or one left by senders since moved to
        another mode.

        Raises:
            ConfigurationError: No entity is named.
            StoreUnavailableError: The store cannot be reached.
        """
        if not entities:
            raise ConfigurationError(
                "name the entities whose records to delete with --entity (repeat); "
                "`georep status` lists them"
            )
        who = who_am_i("georep forget")
        forgotten: dict[str, RoleRecord | None] = {}
        for entity in entities:
            with self._tracer.start_as_current_span(
                "georep forget",
                attributes={"georep.app": self.app, "georep.entity": entity, "enduser.id": who},
            ) as span:
                before = await self.store.read(entity)
                deleted = await self.store.delete(entity)
                span.set_attribute("georep.changed", deleted)
            forgotten[entity] = before if deleted else None
            if deleted:
                _log.warning(
                    "forget %s: its role record deleted, by %s at %s",
                    entity,
                    who,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                )
        return forgotten

    async def _targets(
        self, command: str, entities: Sequence[str], force: bool
    ) -> tuple[list[str], list[RoleChange]]:
        """The entities to change, and the skipped ones; the refusals, before any change."""
        if not entities:
            found = await self.store.entities()
            if not found:
                raise ConfigurationError(
                    f"no process of application {self.app!r} has shared its roles yet: "
                    "name the entity with --entity, or check --app and --redis"
                )
            records = {name: await self.store.read(name) for name in found}
            skipped = [
                RoleChange(name, record, record, changed=False, skipped=ACTIVE_MODE)
                for name, record in records.items()
                if record is not None and record.mode == "active"
            ]
            targets = [name for name in found if name not in {s.entity for s in skipped}]
            if not targets:
                raise ConfigurationError(
                    f"every entity of application {self.app!r} ({', '.join(found)}): "
                    f"{ACTIVE_MODE}; nothing changed"
                )
            return targets, skipped
        records = {name: await self.store.read(name) for name in entities}
        unknown = [name for name, record in records.items() if record is None]
        if unknown and (command == "unpin" or not force):
            known = await self.store.entities()
            listed = ", ".join(known) if known else "none yet"
            fix = (
                "check the name and --app"
                if command == "unpin"
                else "check the name and --app, or pass --force to create the record now "
                "(processes that start later follow it)"
            )
            raise ConfigurationError(
                f"no process of application {self.app!r} has shared roles for "
                f"{', '.join(map(repr, unknown))} (entities with a record: {listed}): "
                f"{fix}; nothing changed"
            )
        active = [name for name, record in records.items() if record and record.mode == "active"]
        if active:
            raise ConfigurationError(
                f"{', '.join(active)}: {ACTIVE_MODE} (`georep {command}` would change "
                "nothing they do); nothing changed. Senders in active mode skip a failing "
                "region on their own; to send to one region at a time, run them in passive "
                "mode"
            )
        return list(entities), []

    async def _apply(
        self,
        command: str,
        region: str | None,
        pinned: bool | None,
        entities: Sequence[str],
        force: bool,
    ) -> list[RoleChange]:
        who = who_am_i(f"georep {command}")
        targets, changes = await self._targets(command, entities, force)
        if pinned is None:  # a failover or failback moves no pinned entity elsewhere
            for entity in targets:
                record = await self.store.read(entity)
                if record is not None and record.pinned and record.active != region:
                    raise _pinned_elsewhere(entity, record, region)
        for entity in targets:
            with self._tracer.start_as_current_span(
                f"georep {command}",
                attributes={"georep.app": self.app, "georep.entity": entity, "enduser.id": who},
            ) as span:
                change = await self._change(entity, command, region, pinned, who)
                span.set_attribute("georep.region", change.after.active)
                span.set_attribute("georep.generation", change.after.generation)
                span.set_attribute("georep.changed", change.changed)
            if change.changed:
                _log.warning(
                    "%s %s: %s active, generation %d%s, by %s at %s",
                    command,
                    entity,
                    change.after.active,
                    change.after.generation,
                    ", pinned" if change.after.pinned else "",
                    who,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                )
            changes.append(change)
        return changes

    async def _change(
        self, entity: str, command: str, region: str | None, pinned: bool | None, who: str
    ) -> RoleChange:
        store = self.store
        for _ in range(_ATTEMPTS):
            before = current = await store.read(entity)
            if current is None:
                if region is None:
                    raise ConfigurationError(f"{entity!r} has no shared roles to unpin")
                # No process shared this entity's roles yet: the ones that start follow this.
                start = RoleRecord(
                    active=region, since=time.time(), automatic=False, changed_by=who
                )
                current = await store.create(entity, start)
            target = current.active if region is None else region
            if current.pinned and pinned is None and target != current.active:
                raise _pinned_elsewhere(entity, current, target)
            wanted_pin = current.pinned if pinned is None else pinned
            if current.active == target and current.pinned == wanted_pin:
                return RoleChange(entity, before, current, changed=before is None)
            terms = RoleChangeTerms(
                current.generation, target, who, time.time(), automatic=False, pinned=wanted_pin
            )
            swapped, after = await store.change(entity, terms)
            if swapped:
                return RoleChange(entity, before, after, changed=True)
        raise ConfigurationError(
            f"{entity}: the roles kept changing under `georep {command}` ({_ATTEMPTS} tries); "
            "run it again"
        )


def _pinned_elsewhere(entity: str, record: RoleRecord, target: str | None) -> ConfigurationError:
    return ConfigurationError(
        f"{entity} is pinned to {record.active}: run `georep unpin` first, or "
        f"`georep pin --region {target}` to pin it there"
    )
