"""Which region of a namespace pair is active, shared by every sender on the pair."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiorwlock

__all__ = ["RoleSnapshot", "RoleState", "role_state_for"]


@dataclass(frozen=True, slots=True)
class RoleSnapshot:
    """The active namespace and the generation it belongs to."""

    active: str
    generation: int


class RoleLink(Protocol):
    """What keeps a :class:`RoleState` in step with a shared role store."""

    async def propose(self, expected: RoleSnapshot, new_active: str) -> bool | None:
        """Swap in the store: whether this call swapped, None to swap locally instead."""
        ...


class RoleState:
    """The active namespace of a pair and a generation number bumped by every swap.

    Sends read it (shared lock); a swap writes it (exclusive lock) and only when the
    generation is still the one the failed send started from. A burst of concurrent
    failures therefore swaps exactly once, and a late failure from before the swap can
    never swap the roles back.

    With a shared role store (``georep.shared_role_state``), a swap is a compare-and-set
    in the store, made under the exclusive lock: the process's sends wait for its one
    round trip, then go where the store says.

    Attributes:
        swaps: Swaps this role state made (a lost compare-and-set is not one).
        pinned: An operator pinned the roles: automatic swaps are refused.
        automatic: The last change of the roles was georep's own, not an operator's.
        shared: True while the roles follow a shared store, False while the store is
            unreachable and this process uses its own, None without a store.
    """

    def __init__(self, active: str) -> None:
        self._lock = aiorwlock.RWLock()
        self._snapshot = RoleSnapshot(active, 0)
        self.swaps = 0
        self.pinned = False
        self.automatic = True
        self.shared: bool | None = None
        self._link: RoleLink | None = None
        self._listeners: list[Callable[[RoleSnapshot], None]] = []

    @property
    def current(self) -> RoleSnapshot:
        """The latest snapshot, without waiting (for stats and logs)."""
        return self._snapshot

    def read_now(self) -> RoleSnapshot | None:
        """The snapshot without waiting, or None while a swap holds the exclusive lock."""
        return None if self._lock.writer_lock.locked else self._snapshot

    async def read(self) -> RoleSnapshot:
        # The shared lock would be granted at once unless a swap holds the exclusive one,
        # so only then is it taken (7 us on every send otherwise).
        if not self._lock.writer_lock.locked:
            return self._snapshot
        async with self._lock.reader_lock:
            return self._snapshot

    async def swap(self, *, expected: RoleSnapshot, new_active: str) -> bool:
        """Make ``new_active`` active if nothing changed since ``expected``.

        Returns:
            True when this call swapped the roles.
        """
        async with self._lock.writer_lock:
            if self._snapshot != expected or expected.active == new_active or self.pinned:
                return False
            if self._link is not None:
                swapped = await self._link.propose(expected, new_active)
                if swapped is not None:
                    self.swaps += swapped
                    return swapped
            self.adopt(RoleSnapshot(new_active, expected.generation + 1))
            self.swaps += 1
            return True

    def adopt(self, snapshot: RoleSnapshot) -> None:
        """Take ``snapshot`` as it is (the shared store's word); listeners hear of a new
        active region."""
        previous, self._snapshot = self._snapshot, snapshot
        if previous.active != snapshot.active:
            for listener in list(self._listeners):
                listener(snapshot)

    def link(self, link: RoleLink) -> None:
        """Route swaps through ``link`` (a shared role store)."""
        self._link = link

    def on_change(self, listener: Callable[[RoleSnapshot], None]) -> Callable[[], None]:
        """Call ``listener(snapshot)`` whenever the active region changes; returns the
        function that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None


_shared: weakref.WeakValueDictionary[
    tuple[asyncio.AbstractEventLoop, frozenset[str]], RoleState
] = weakref.WeakValueDictionary()


def role_state_for(primary: str, secondary: str) -> RoleState:
    """The role state every sender on this namespace pair shares (in this event loop).

    The first sender on a pair makes its primary active; senders created later on the same
    pair (in either order) see the current roles. The state lives as long as one sender
    holds it.
    """
    key = (asyncio.get_running_loop(), frozenset((primary, secondary)))
    state = _shared.get(key)
    if state is None:
        state = RoleState(primary)
        _shared[key] = state
    return state
