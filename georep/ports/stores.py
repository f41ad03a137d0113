"""The stores a fleet shares: the outbox, the seen-set, session state, roles."""

from __future__ import annotations

__all__ = [
    "FINAL_STATES",
    "NO_RECORD",
    "ClaimState",
    "Claims",
    "Outbox",
    "OutboxEntry",
    "OutboxItems",
    "OutboxSessions",
    "RoleChangeTerms",
    "RoleRecord",
    "RoleStore",
    "ScheduleStore",
    "SeenStore",
    "SessionStateStore",
]

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias, runtime_checkable

OutboxItems: TypeAlias = Sequence[tuple[str | None, bytes]]
"""What :meth:`Outbox.put` stores: ``(region or None, encoded message)`` pairs, in order."""

OutboxSessions: TypeAlias = Sequence[str | None] | None
"""Each stored item's session id (None: not in a session), or None for no sessions at all."""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One message waiting in the outbox.

    Attributes:
        entry_id: Assigned by the store, unique within it.
        channel: Which sender it belongs to (namespace pair and entity).
        region: The region it must reach, or None for whichever region accepts it.
        payload: The message, encoded by :meth:`MessageCodec.encode`.
        enqueued_at: Wall-clock seconds when it was stored.
        attempts: Failed delivery attempts so far.
        session_id: The message's session, or None. A session's entries are claimed in
            order (see :meth:`Outbox.claim`).
    """

    entry_id: int
    channel: str
    region: str | None
    payload: bytes
    enqueued_at: float
    attempts: int
    session_id: str | None = None


@runtime_checkable
class Outbox(Protocol):
    """A durable local queue of messages no region accepted yet (SPEC §2.3).

    Implementations persist every entry before :meth:`put` returns, and delete it only
    when told to (after a region accepted it), so nothing acknowledged is lost. An entry
    that can never be sent leaves the queue through :meth:`dead_letter` and is kept aside.

    Claims carry an ``owner`` (one per drainer): :meth:`renew`, :meth:`release` and
    :meth:`retry_later` given an owner only touch entries that owner still holds, so a
    drainer whose lease ran out never disturbs the drainer that took the entry over.
    """

    async def put(
        self, channel: str, items: OutboxItems, *, now: float, sessions: OutboxSessions = None
    ) -> list[int]:
        """Store ``(region, payload)`` items atomically; return their entry ids.

        ``sessions`` gives each item's session id (None: not in a session); default none.

        Raises:
            OutboxFullError: Storing them would exceed the outbox's bound (or its disk is
                full); none is stored.
        """
        ...

    async def claim(
        self, channel: str, *, limit: int, now: float, lease: float, owner: str | None = None
    ) -> list[OutboxEntry]:
        """Up to ``limit`` entries of ``channel`` that are due and not leased, oldest first.

        They stay leased to ``owner`` for ``lease`` seconds, so a second drainer (in this
        process or another) does not send them at the same time.

        A session's entries are claimed in order: an entry is not returned while an
        earlier entry of its session that could go to the same region (the same
        ``region``, or either of them None) is leased or not yet due. So one drainer at a
        time holds a session's next entries, and never one behind another drainer's.
        """
        ...

    async def held_sessions(
        self, channel: str, session_ids: Sequence[str] | None = None
    ) -> set[str]:
        """The sessions of ``channel`` with an entry still queued (leased or not; the
        dead-lettered ones do not count), among ``session_ids`` (None: every session)."""
        ...

    async def renew(
        self, entry_ids: Sequence[int], *, owner: str, now: float, lease: float
    ) -> list[int]:
        """Extend ``owner``'s leases to ``now + lease``; return the ids it still holds."""
        ...

    async def release(self, entry_ids: Sequence[int], *, owner: str | None = None) -> None:
        """Hand leased entries back unsent: due again at once, no attempt counted."""
        ...

    async def delete(self, entry_ids: Sequence[int]) -> None:
        """Remove delivered entries."""
        ...

    async def retry_later(
        self, entry_ids: Sequence[int], *, not_before: float, owner: str | None = None
    ) -> None:
        """Count a failed attempt, drop the lease, and make them due again at ``not_before``."""
        ...

    async def dead_letter(self, entries: Sequence[tuple[int, str]], *, now: float) -> None:
        """Move ``(entry_id, reason)`` entries out of the queue into the dead-letter store.

        ``reason`` names the error's class and kind, never its text (it may hold a secret).
        """
        ...

    async def depth(self, channel: str | None = None) -> int:
        """Entries queued (for ``channel``, or in total); dead-lettered ones not included."""
        ...

    async def aclose(self) -> None:
        """Release the store; idempotent."""
        ...


class ClaimState(enum.StrEnum):
    """What :meth:`SeenStore.claim` found for one dedup key, and the outcomes it records."""

    CLAIMED = "claimed"
    """Ours now: process the message, then commit (or release on failure)."""
    IN_FLIGHT = "in-flight"
    """Another consumer holds a live claim: wait for its outcome."""
    DONE = "done"
    """Processed already (within the dedup window): settle the copy without processing."""
    DEAD_LETTERED = "dead-lettered"
    """Dead-lettered already (by a handler, or after ``max_attempts``): dead-letter this copy
    too, never process it. The recorded reason is in :attr:`Claims.reasons`."""
    DEFERRED = "deferred"
    """Deferred already by a handler: defer this copy too, never process it."""


FINAL_STATES: tuple[ClaimState, ...] = (
    ClaimState.DONE,
    ClaimState.DEAD_LETTERED,
    ClaimState.DEFERRED,
)
"""The outcomes :meth:`SeenStore.commit` records (the others are claim answers only)."""


class Claims(list[ClaimState]):
    """What :meth:`SeenStore.claim` returns: the states in key order, plus reasons.

    A plain list of :class:`ClaimState` (compares equal to one), with the reason each
    :attr:`ClaimState.DEAD_LETTERED` key was committed with, read in the same round trip.

    Attributes:
        reasons: Index in the key list -> the dead-letter reason recorded for that key.
    """

    __slots__ = ("reasons",)

    def __init__(
        self, states: Sequence[ClaimState] = (), reasons: dict[int, str] | None = None
    ) -> None:
        super().__init__(states)
        self.reasons: dict[int, str] = reasons if reasons is not None else {}


@runtime_checkable
class SeenStore(Protocol):
    """The shared record of which logical messages were processed (SPEC §2.4).

    Claim -> process -> commit: a key is marked done only after its handler succeeded. A
    claim is a lease: if its holder dies, the lease expires and the key can be claimed
    again. Every method takes many keys and costs one round trip to the store.

    Implementations raise :class:`georep.exceptions.StoreUnavailableError` when the store
    cannot be reached, and nothing else for that condition.
    """

    async def claim(self, keys: Sequence[str], *, owner: str, lease: float) -> list[ClaimState]:
        """Try to claim each key for ``owner`` for ``lease`` seconds.

        A key already claimed by the same ``owner`` is claimed again (lease renewed).
        Implementations return a :class:`Claims` so that dead-letter reasons come back in
        the same round trip; a plain list means "no reasons known".
        """
        ...

    async def commit(
        self,
        keys: Sequence[str],
        *,
        owner: str,
        outcome: ClaimState = ...,
        reasons: Sequence[str] | None = ...,
    ) -> None:
        """Record the keys' final outcome for the store's dedup window (whoever holds them).

        Args:
            keys: The dedup keys.
            owner: The committing consumer.
            outcome: One of :data:`FINAL_STATES`. Default ``DONE`` (processed).
            reasons: For ``DEAD_LETTERED``: one reason per key, returned to later claims
                (default none).

        Raises:
            ConfigurationError: ``outcome`` is not a final state, or ``reasons`` does not
                have one entry per key.
        """
        ...

    async def release(self, keys: Sequence[str], *, owner: str) -> None:
        """Drop ``owner``'s claims (the handler failed); others' claims are untouched."""
        ...

    async def peek(self, keys: Sequence[str]) -> list[ClaimState | None]:
        """The keys' states without claiming them: IN_FLIGHT (claimed by anyone), a final
        state, or None (no entry). Session order reads its predecessors' states with it."""
        ...

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        """Renew ``owner``'s claims for ``lease`` more seconds; False where it lost them."""
        ...

    async def aclose(self) -> None:
        """Release connections this store created; idempotent."""
        ...


@runtime_checkable
class SessionStateStore(Protocol):
    """Where a GeoReceiver in session mode keeps session state (docs/sessions.md §3).

    Both regions' receivers read and write one value per session, so the state survives a
    failover. ``RedisSeenSet`` and ``InMemorySeenSet`` implement it beside the seen-set.
    Failures raise :class:`georep.exceptions.StoreUnavailableError`.
    """

    async def get_session_state(self, key: str) -> bytes | None: ...

    async def set_session_state(self, key: str, state: bytes | None) -> None: ...


@runtime_checkable
class ScheduleStore(Protocol):
    """Where senders keep which copy of a scheduled message each region holds.

    ``GeoSender.schedule_messages`` returns one sequence number per message, as the SDK
    does; in active mode each message is scheduled in both regions, under a different
    number in each. The sender records, per returned number, the other region's number
    here, so that ``cancel_scheduled_messages`` with that number cancels both copies from
    any process, after a restart too. ``RedisSeenSet`` and ``InMemorySeenSet`` implement
    it beside the seen-set. Failures raise
    :class:`georep.exceptions.StoreUnavailableError`.
    """

    async def keep_schedules(
        self, scope: str, entries: Mapping[int, bytes], *, expires_at: float
    ) -> None:
        """Store ``entries`` (returned number -> what to cancel) under ``scope`` (the sender's
        namespace pair and entity) until ``expires_at`` (Unix epoch seconds)."""
        ...

    async def find_schedules(self, scope: str, numbers: Sequence[int]) -> list[bytes | None]:
        """What :meth:`keep_schedules` stored for each number (None: nothing, or expired)."""
        ...

    async def drop_schedules(self, scope: str, numbers: Sequence[int]) -> None:
        """Forget the entries of ``numbers`` (cancelled)."""
        ...


@dataclass(frozen=True, slots=True)
class RoleRecord:
    """The shared roles of one entity: which region is active, and who said so.

    Attributes:
        active: The active region's label (``"primary"`` or ``"secondary"``).
        generation: Bumped by every change of ``active`` (never by a pin or unpin).
        since: Wall-clock seconds (Unix epoch) when ``active`` last changed, or when the
            record was created.
        pinned: No automatic swap while set: only an operator moves the roles.
        automatic: The last change of ``active`` was georep's own (a failover or a
            failback), not an operator's. Automatic failback undoes only those.
        changed_by: Who made the last change: ``user@host pid N (what)``.
        mode: How the senders that created the record replicate: ``"active"`` (every
            message to both regions: no region is active, so an operator's failover
            changes nothing they do), ``"passive"``, or ``""`` when not known (a
            PairedSender's or FailoverChannel's record, an operator's, or one written
            before georep recorded the mode). Set when the record is created; a change
            keeps it.
    """

    active: str
    generation: int = 0
    since: float = 0.0
    pinned: bool = False
    automatic: bool = True
    changed_by: str = ""
    mode: str = ""


#: What a change answers for an entity without a record.
NO_RECORD: Final = RoleRecord(active="", generation=-1)


@dataclass(frozen=True, slots=True)
class RoleChangeTerms:
    """The terms of one :meth:`RoleStore.change`: make ``active`` active if the entity's
    generation is still ``expected_generation``.

    Attributes:
        expected_generation: The generation the change was decided on.
        active: The region label to make active.
        changed_by: Who the record says made the change (``user@host pid N (what)``).
        now: Wall-clock seconds; the record's ``since`` when the active region moves.
        automatic: A failover's change (refused while the record is pinned), not an
            operator's. Default True.
        pinned: Pin (True) or unpin (False) the record; None leaves it. Default None.
    """

    expected_generation: int
    active: str
    changed_by: str
    now: float
    automatic: bool = True
    pinned: bool | None = None

    def apply(self, stored: RoleRecord | None) -> tuple[bool, RoleRecord]:
        """The port's rule on the stored record: (True, the record now stored) or (False,
        the stored one, or :data:`NO_RECORD`). ``RedisRoleStore`` runs it in Lua."""
        if stored is None:
            return False, NO_RECORD
        if stored.generation != self.expected_generation or (self.automatic and stored.pinned):
            return False, stored
        moved = stored.active != self.active
        return True, RoleRecord(
            active=self.active,
            generation=stored.generation + moved,
            since=self.now if moved else stored.since,
            pinned=stored.pinned if self.pinned is None else self.pinned,
            automatic=self.automatic if moved else stored.automatic,
            changed_by=self.changed_by,
            mode=stored.mode,
        )


@runtime_checkable
class RoleStore(Protocol):
    """Roles shared by every process of one application, one record per entity.

    A change is a compare-and-set on the generation: however many processes race to swap
    from the same generation, one wins and the others get the winner's record. Every
    method raises :class:`georep.exceptions.StoreUnavailableError` when the store cannot
    be reached or does not answer within its operation timeout, and nothing else for that.
    """

    async def read(self, entity: str) -> RoleRecord | None:
        """The entity's record, or None when no process created one yet."""
        ...

    async def create(self, entity: str, record: RoleRecord) -> RoleRecord:
        """Store ``record`` unless the entity has one; return the stored record."""
        ...

    async def change(self, entity: str, terms: RoleChangeTerms) -> tuple[bool, RoleRecord]:
        """Apply ``terms`` to the entity's record atomically (:meth:`RoleChangeTerms.apply`).

        The generation is bumped (and ``since`` set to ``terms.now``) only when
        ``terms.active`` differs from the stored one; ``terms.pinned`` (None: unchanged) is
        set either way. An ``automatic`` change of a pinned record is refused.

        Returns:
            (True, the new record), or (False, the stored record) when the generation
            had moved on, the record is pinned against an automatic change, or the
            entity has no record (then :data:`NO_RECORD`).
        """
        ...

    async def entities(self) -> list[str]:
        """The entities that have a record, sorted."""
        ...

    async def delete(self, entity: str) -> bool:
        """Remove the entity's record (and the entity from :meth:`entities`) atomically.

        A process still sharing the entity's roles creates the record again from its own
        roles at its next read of the store (``georep forget``).

        Returns:
            True if there was a record, False if there was none.
        """
        ...

    async def report_failure(
        self, entity: str, *, region: str, generation: int, reporter: str, now: float, window: float
    ) -> int:
        """Record that ``reporter`` (one process) saw ``region`` fail while ``generation``
        was the entity's generation, at wall-clock ``now``; return how many distinct
        reporters did so within the last ``window`` seconds, this one included.

        Only needed for ``Corroboration(reports=N)`` with N > 1; reports are kept about
        ``window`` seconds, apart from the record.
        """
        ...

    async def aclose(self) -> None:
        """Release what the store opened (idempotent)."""
        ...
