"""What an operator does to the shared roles: fail over, fail back, pin and unpin.

``georep failover``, ``failback``, ``pin`` and ``unpin`` (``georep.cli``) call these on a
shared :class:`georep.ports.RoleStore`. Each change is one compare-and-set in the store,
logged (who, when, what) and traced (a span ``georep {command}``); every process follows
it at its next background read of the store (``refresh_interval``, 0.25 s by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace

from georep._role_store import who_am_i
from georep.exceptions import ConfigurationError
from georep.ports import RoleRecord, RoleStore

__all__ = ["REGIONS", "RoleChange", "RoleCommands"]

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
        changed: False when it already was as asked.
    """

    entity: str
    before: RoleRecord | None
    after: RoleRecord
    changed: bool


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

    async def failover(self, to: str, entities: Sequence[str] = ()) -> list[RoleChange]:
        """Make ``to`` active. Without ``entities``, for every entity with a record.

        Raises:
            ConfigurationError: ``to`` is not a region, no entity has a record (name one),
                or an entity is pinned to the other region (unpin it first).
            StoreUnavailableError: The store cannot be reached.
        """
        return await self._apply("failover", check_region(to), None, entities)

    async def failback(self, entities: Sequence[str] = ()) -> list[RoleChange]:
        """Make the primary active again (``failover`` to ``primary``)."""
        return await self._apply("failback", "primary", None, entities)

    async def pin(self, region: str, entities: Sequence[str] = ()) -> list[RoleChange]:
        """Make ``region`` active and keep it so: no automatic swap until :meth:`unpin`."""
        return await self._apply("pin", check_region(region), True, entities)

    async def unpin(self, entities: Sequence[str] = ()) -> list[RoleChange]:
        """Allow automatic swaps again; the active region stays as it is."""
        return await self._apply("unpin", None, False, entities)

    async def _entities(self, entities: Sequence[str]) -> list[str]:
        if entities:
            return list(entities)
        found = await self.store.entities()
        if not found:
            raise ConfigurationError(
                f"no process of application {self.app!r} has shared its roles yet: name "
                "the entity with --entity, or check --app and --redis"
            )
        return found

    async def _apply(
        self, command: str, region: str | None, pinned: bool | None, entities: Sequence[str]
    ) -> list[RoleChange]:
        who = who_am_i(f"georep {command}")
        changes = []
        for entity in await self._entities(entities):
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
                raise ConfigurationError(
                    f"{entity} is pinned to {current.active}: run `georep unpin` first, or "
                    f"`georep pin --region {target}` to pin it there"
                )
            wanted_pin = current.pinned if pinned is None else pinned
            if current.active == target and current.pinned == wanted_pin:
                return RoleChange(entity, before, current, changed=before is None)
            swapped, after = await store.change(
                entity,
                expected_generation=current.generation,
                active=target,
                changed_by=who,
                now=time.time(),
                automatic=False,
                pinned=wanted_pin,
            )
            if swapped:
                return RoleChange(entity, before, after, changed=True)
        raise ConfigurationError(
            f"{entity}: the roles kept changing under `georep {command}` ({_ATTEMPTS} tries); "
            "run it again"
        )
