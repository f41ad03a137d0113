"""Which region of a namespace pair is active, shared by every sender on the pair."""

from __future__ import annotations

__all__ = ["DEPART", "FailoverEvidence", "RoleMove", "RoleSnapshot", "RoleState", "role_state_for"]

import asyncio
import enum
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Protocol

import aiorwlock

if TYPE_CHECKING:
    from georep._policy import Corroboration


@dataclass(frozen=True, slots=True)
class RoleSnapshot:
    """The active namespace and the generation it belongs to."""

    active: str
    generation: int


@dataclass(frozen=True, slots=True)
class FailoverEvidence:
    """What a process knows of the region it is failing over from (issue 31).

    Attributes:
        reached_ago: Seconds since this process last reached the failing region, None
            when it never has.
        corroboration: What the sender's policy asks before the whole fleet moves.
    """

    reached_ago: float | None
    corroboration: Corroboration


#: What :meth:`RoleLink.propose` answers for a failover that is not corroborated: the
#: roles move for this process only.
DEPART: Final = "depart"


class RoleMove(enum.StrEnum):
    """What one :meth:`RoleState.move` did."""

    UNCHANGED = "unchanged"
    """Nothing moved: the roles had changed since the snapshot, the compare-and-set in the
    store lost, or the roles are pinned."""
    SWAPPED = "swapped"
    """The roles moved for everyone sharing them (in the store, or locally without one)."""
    LEFT = "left"
    """The roles moved for this process only: the failure was not corroborated."""
    REJOINED = "rejoined"
    """This process went back to the shared roles it had left."""


class RoleLink(Protocol):
    """What keeps a :class:`RoleState` in step with a shared role store."""

    async def propose(
        self, expected: RoleSnapshot, new_active: str, evidence: FailoverEvidence | None
    ) -> bool | Literal["depart"] | None:
        """Swap in the store: whether this call swapped, None to swap locally instead,
        :data:`DEPART` to move this process only (``evidence`` does not corroborate a
        move of every process)."""
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
        departures: Times this process left the shared roles on an uncorroborated
            failure (see :class:`georep.Corroboration`).
        departed_from: While this process uses its own roles after an uncorroborated
            failure, the shared snapshot it left (None otherwise).
        pinned: An operator pinned the roles: automatic swaps are refused.
        automatic: The last change of the roles was georep's own, not an operator's.
        shared: True while the roles follow a shared store, False while the store is
            unreachable and this process uses its own, None without a store.
    """

    def __init__(self, active: str) -> None:
        self._lock = aiorwlock.RWLock()
        self._snapshot = RoleSnapshot(active, 0)
        self.swaps = 0
        self.departures = 0
        self.departed_from: RoleSnapshot | None = None
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
        return await self.move(expected=expected, new_active=new_active) is not RoleMove.UNCHANGED

    async def move(
        self,
        *,
        expected: RoleSnapshot,
        new_active: str,
        evidence: FailoverEvidence | None = None,
    ) -> RoleMove:
        """Make ``new_active`` active if nothing changed since ``expected``.

        With a shared role store and ``evidence`` (a failover), the store is changed only
        when the evidence corroborates it; otherwise the roles move for this process only
        (:attr:`RoleMove.LEFT`). A move back to the shared roles this process left
        rejoins them without asking the store.
        """
        async with self._lock.writer_lock:
            if self._snapshot != expected or expected.active == new_active or self.pinned:
                return RoleMove.UNCHANGED
            departed = self.departed_from
            if departed is not None and new_active == departed.active:
                self.departed_from = None
                self.adopt(departed)
                return RoleMove.REJOINED
            if self._link is not None:
                answer = await self._link.propose(expected, new_active, evidence)
                if answer == DEPART:
                    self.departed_from = expected
                    self.departures += 1
                    self.adopt(RoleSnapshot(new_active, expected.generation))
                    return RoleMove.LEFT
                if isinstance(answer, bool):
                    self.swaps += answer
                    return RoleMove.SWAPPED if answer else RoleMove.UNCHANGED
            self.departed_from = None
            self.adopt(RoleSnapshot(new_active, expected.generation + 1))
            self.swaps += 1
            return RoleMove.SWAPPED

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
