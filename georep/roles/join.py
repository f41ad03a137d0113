"""How a GeoSender, a PairedSender or a FailoverChannel joins roles kept in a role store.

Each of them shares its roles through a :class:`georep.ports.RoleStore` the same way: the
link to the store (:func:`georep.roles.store.shared_role_state`) is made the first time the
roles are needed, and its background refresh runs from then until the owner closes;
``async with`` reads the store once first, so the first send already follows it.
"""

from __future__ import annotations

__all__ = ["RoleJoin", "role_join"]

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

from georep.ports import Clock, RoleStore
from georep.roles.state import RoleState
from georep.roles.store import SharedRoles, shared_role_state

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider


class RoleJoin:
    """One owner's link to its entity's roles in ``store`` (the caller owns the store).

    ``names`` maps each region label in the store to the owner's name for that region (a
    namespace, an endpoint label); the link is :func:`georep.roles.store.shared_role_state`
    for ``entity``, shared with every owner of the same entity in this loop. ``mode`` is
    the owner's replication mode (``"active"``, ``"passive"``, ``""`` unknown).
    """

    def __init__(
        self,
        store: RoleStore,
        entity: str,
        names: Mapping[str, str],
        *,
        clock: Clock,
        meter_provider: MeterProvider | None,
        mode: str = "",
    ) -> None:
        self._join = partial(
            shared_role_state,
            store,
            entity,
            names=names,
            clock=clock,
            meter_provider=meter_provider,
            mode=mode,
        )
        self.link: SharedRoles | None = None
        """The link held (its refresh running), once joined."""

    def state(self, initial: str, *, hold: bool = True) -> RoleState:
        """The shared role state, joined now if not yet.

        Args:
            initial: The local name active until the store answers.
            hold: Start the background refresh (and keep the link until :meth:`release`);
                False for an owner already closed.
        """
        if self.link is not None:
            return self.link.state
        link = self._join(initial=initial)
        if hold:
            link.hold()
            self.link = link
        return link.state

    async def refresh(self) -> None:
        """Read the store now (``async with``, before the first use), if joined."""
        if self.link is not None:
            await self.link.refresh()

    async def release(self) -> None:
        """Stop holding the link (the last holder stops its refresh)."""
        if self.link is not None:
            await self.link.release()


def role_join(
    store: RoleStore | None,
    entity: str,
    names: Mapping[str, str],
    *,
    clock: Clock,
    meter_provider: MeterProvider | None,
    mode: str = "",
) -> RoleJoin | None:
    """The owner's :class:`RoleJoin` to ``store``; None without a store (roles kept in the
    process). ``mode``: the owner's replication mode, recorded in a record it creates."""
    if store is None:
        return None
    return RoleJoin(store, entity, names, clock=clock, meter_provider=meter_provider, mode=mode)
