"""Where a duplicate is suppressed: the seen-set's claim decides each copy's fate.

Each logical message reaches a GeoReceiver up to twice (once per region, and again on a
redelivery). Every turn of a region loop (:mod:`georep.receive.region_loop`) claims the
dedup keys of the copies it received in the seen-set, in one round trip, and
:func:`sort_by_claim` reads the answer:

* ``CLAIMED``: ours; the handler runs, then the outcome is committed for every consumer
  (:mod:`georep.receive.outcomes`) and the copy settled (:mod:`georep.receive.settlement`);
* ``IN_FLIGHT``: another consumer holds it; the copy stays locked ("parked") and is claimed
  again next turn, to get that consumer's outcome;
* a final state (``DONE``, ``DEAD_LETTERED``, ``DEFERRED``): the **duplicate**; it is
  settled the way the first copy was, and never reaches the handler;
* no key at all (no MessageId): processed unchecked.

:class:`georep.ports.SeenStore` is the contract. ``georep.adapters.redis.RedisSeenSet`` and
:class:`georep.testing.InMemorySeenSet` inherit :class:`_SeenSetBase`: a commit's terms
are checked here, once, and each store writes only how it records them.
"""

from __future__ import annotations

__all__ = ["ClaimedTurn", "_SeenSetBase", "first_of_each_key", "sort_by_claim"]

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from georep._lifecycle import AsyncResource
from georep.ports import FINAL_STATES, Claims, ClaimState
from georep.receive.outcomes import check_commit

if TYPE_CHECKING:
    from georep.receive.settlement import Copy


class _SeenSetBase(AsyncResource):
    """A seen-set's :meth:`commit`, checked before :meth:`_commit` records it."""

    async def commit(
        self,
        keys: Sequence[str],
        *,
        owner: str,
        outcome: ClaimState = ClaimState.DONE,
        reasons: Sequence[str] | None = None,
    ) -> None:
        """Record the keys' final outcome for the window, whoever holds them.

        Raises:
            ConfigurationError: ``outcome`` is not final, or ``reasons`` is not one per key.
        """
        await self._commit(keys, owner, outcome, check_commit(keys, outcome, reasons))

    async def _commit(
        self, keys: Sequence[str], owner: str, outcome: ClaimState, reasons: list[str]
    ) -> None:
        """Record ``outcome`` (a final state) for the keys, ``reasons`` one per key."""
        raise NotImplementedError


def first_of_each_key(copies: Sequence[Copy]) -> tuple[list[Copy], list[Copy]]:
    """The copies to claim (first of each dedup key) and the repeats of a key in the turn.

    Two copies of one message in one turn (a redelivery, a replayed batch): our claim is
    re-entrant for our own owner, so only the first is claimed; the others wait a turn and
    then find it done (or released, after a failure).
    """
    checked: list[Copy] = []
    repeats: list[Copy] = []
    seen_keys: set[str] = set()
    for copy in copies:
        key = copy.delivery.key
        if key is None:
            continue
        (repeats if key in seen_keys else checked).append(copy)
        seen_keys.add(key)
    return checked, repeats


@dataclass(slots=True)
class ClaimedTurn:
    """One turn's copies, sorted by what the seen-set answered (:func:`sort_by_claim`)."""

    to_process: list[Copy] = field(default_factory=list)
    """Claimed by us: the handler runs."""
    unchecked: list[Copy] = field(default_factory=list)
    """Without a dedup key, or the seen-set unreachable with policy ``process``."""
    parked: list[Copy] = field(default_factory=list)
    """In flight at another consumer, or a repeat of a key in this turn: claimed again
    next turn."""
    twins: list[tuple[Copy, ClaimState, str | None]] = field(default_factory=list)
    """Duplicates: their key has a final outcome (and its reason, if dead-lettered);
    settled the same way, never handed to the handler."""


def sort_by_claim(
    copies: Sequence[Copy],
    checked: Sequence[Copy],
    repeats: Sequence[Copy],
    states: Sequence[ClaimState] | None,
) -> ClaimedTurn:
    """Sort a turn's ``copies`` by the claim ``states`` of ``checked`` (the first copy of
    each key, :func:`first_of_each_key`); ``states`` None means the seen-set could not be
    reached and the policy is to process anyway (every copy unchecked)."""
    if states is None:
        return ClaimedTurn(unchecked=list(copies))
    turn = ClaimedTurn(unchecked=[c for c in copies if c.delivery.key is None])
    reasons = states.reasons if isinstance(states, Claims) else {}
    for index, (copy, state) in enumerate(zip(checked, states, strict=True)):
        if state is ClaimState.CLAIMED:
            turn.to_process.append(copy)
        elif state is ClaimState.IN_FLIGHT:
            turn.parked.append(copy)
        elif state in FINAL_STATES:
            turn.twins.append((copy, state, reasons.get(index)))
    turn.parked += repeats
    return turn
