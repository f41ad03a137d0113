"""What every seen-set does the same way, whatever holds its keys.

:class:`georep.ports.SeenStore` is the contract. ``georep.adapters.redis.RedisSeenSet`` and
:class:`georep.testing.InMemorySeenSet` inherit :class:`_SeenSetBase`: a commit's terms
are checked here, once, and each store writes only how it records them.
"""

from __future__ import annotations

from collections.abc import Sequence

from georep._lifecycle import AsyncResource
from georep.ports import ClaimState
from georep.receive.outcomes import check_commit

__all__ = ["_SeenSetBase"]


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
