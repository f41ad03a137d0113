"""An in-memory :class:`georep.ports.Outbox` for unit tests: same rules, no I/O, no durability."""

from __future__ import annotations

__all__ = ["InMemoryOutbox"]

from collections.abc import Sequence
from dataclasses import dataclass, replace

from georep._lifecycle import AsyncResource
from georep.outbox.sqlite import (
    OutboxRecord,
    check_claim_arguments,
    check_outbox_bounds,
    item_sessions,
    outbox_full_error,
)
from georep.ports import OutboxEntry, OutboxItems, OutboxSessions


@dataclass(slots=True)
class _StoredEntry:
    # Mutable on purpose: claims and retries change the lease and due time in place.
    entry: OutboxEntry
    not_before: float
    leased_until: float = 0.0
    leased_by: str | None = None
    reason: str | None = None
    dead_at: float | None = None


class InMemoryOutbox(AsyncResource):
    """Behaves like :class:`georep.SqliteOutbox` (bounds, leases, errors) but lives in a dict.

    Args:
        max_entries: Most entries stored at once, across all channels. Default 100_000.
        max_bytes: Most payload bytes stored at once, across all channels. Default 1 GiB.

    Raises:
        ConfigurationError: A bound is not positive.
    """

    def __init__(self, *, max_entries: int = 100_000, max_bytes: int = 1 << 30) -> None:
        check_outbox_bounds(max_entries=max_entries, max_bytes=max_bytes)
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        # Ids only grow, so insertion order is entry-id order (oldest first).
        self._stored: dict[int, _StoredEntry] = {}
        self._dead: dict[int, _StoredEntry] = {}
        self._payload_bytes = 0
        self._next_entry_id = 1

    @property
    def last_known_depth(self) -> int:
        """Total entries stored (always current: nothing else writes this store)."""
        return len(self._stored)

    async def put(
        self, channel: str, items: OutboxItems, *, now: float, sessions: OutboxSessions = None
    ) -> list[int]:
        """Store ``(region, payload)`` items all or none; return their entry ids.

        Raises:
            OutboxFullError: Storing them would exceed ``max_entries`` or ``max_bytes``;
                none is stored.
            ClosedError: The outbox was closed.
            ConfigurationError: ``sessions`` does not have one id per item.
        """
        self._check_open()
        payloads = [(region, bytes(payload)) for region, payload in items]
        session_ids = item_sessions(payloads, sessions)
        self._check_room(len(payloads), sum(len(payload) for _, payload in payloads))
        entry_ids: list[int] = []
        for (region, payload), session_id in zip(payloads, session_ids, strict=True):
            entry_id = self._next_entry_id
            self._next_entry_id += 1
            entry = OutboxEntry(entry_id, channel, region, payload, now, 0, session_id)
            self._stored[entry_id] = _StoredEntry(entry=entry, not_before=now)
            entry_ids.append(entry_id)
            self._payload_bytes += len(payload)
        return entry_ids

    def _check_room(self, new_entries: int, new_bytes: int) -> None:
        if (
            len(self._stored) + new_entries > self._max_entries
            or self._payload_bytes + new_bytes > self._max_bytes
        ):
            raise outbox_full_error(
                store="in-memory outbox",
                entries=len(self._stored),
                payload_bytes=self._payload_bytes,
                new_entries=new_entries,
                new_bytes=new_bytes,
                max_entries=self._max_entries,
                max_bytes=self._max_bytes,
            )

    async def claim(
        self, channel: str, *, limit: int, now: float, lease: float, owner: str | None = None
    ) -> list[OutboxEntry]:
        """Lease up to ``limit`` due, unleased entries of ``channel``, oldest first; a
        session's entries only behind its earlier ones (as :class:`georep.SqliteOutbox`).

        Raises:
            ConfigurationError: ``limit`` is below 1 or ``lease`` is not positive.
            ClosedError: The outbox was closed.
        """
        self._check_open()
        check_claim_arguments(limit=limit, lease=lease)
        claimed: list[OutboxEntry] = []
        # (session, region) of the channel's earlier entries that cannot be claimed now.
        waiting: list[tuple[str, str | None]] = []
        for stored in self._stored.values():
            if len(claimed) == limit:
                break
            entry = stored.entry
            if entry.channel != channel:
                continue
            due = stored.not_before <= now and stored.leased_until <= now
            session = entry.session_id
            if session is not None and any(
                other == session
                and (region is None or entry.region is None or region == entry.region)
                for other, region in waiting
            ):
                due = False
            elif session is not None and not due:
                waiting.append((session, entry.region))
            if due:
                stored.leased_until = now + lease
                stored.leased_by = owner
                claimed.append(entry)
        return claimed

    async def held_sessions(
        self, channel: str, session_ids: Sequence[str] | None = None
    ) -> set[str]:
        """The sessions of ``channel`` with an entry still queued, among ``session_ids``.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._check_open()
        held = {
            s.entry.session_id
            for s in self._stored.values()
            if s.entry.channel == channel and s.entry.session_id is not None
        }
        return held if session_ids is None else held & set(session_ids)

    async def renew(
        self, entry_ids: Sequence[int], *, owner: str, now: float, lease: float
    ) -> list[int]:
        """Extend ``owner``'s leases to ``now + lease``; return the ids it still holds.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._check_open()
        held: list[int] = []
        for entry_id in entry_ids:
            stored = self._stored.get(entry_id)
            if stored is not None and stored.leased_by == owner:
                stored.leased_until = now + lease
                held.append(entry_id)
        return held

    async def release(self, entry_ids: Sequence[int], *, owner: str | None = None) -> None:
        """Hand leased entries back unsent: due at once, no attempt counted.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._check_open()
        for stored in self._held(entry_ids, owner):
            stored.leased_until = 0.0
            stored.leased_by = None

    async def delete(self, entry_ids: Sequence[int]) -> None:
        """Remove delivered entries; ids no longer stored are ignored.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._check_open()
        for entry_id in entry_ids:
            stored = self._stored.pop(entry_id, None)
            if stored is not None:
                self._payload_bytes -= len(stored.entry.payload)

    async def retry_later(
        self, entry_ids: Sequence[int], *, not_before: float, owner: str | None = None
    ) -> None:
        """Count a failed attempt, drop the lease, and make them due again at ``not_before``.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._check_open()
        for stored in self._held(entry_ids, owner):
            stored.entry = replace(stored.entry, attempts=stored.entry.attempts + 1)
            stored.leased_until = 0.0
            stored.leased_by = None
            stored.not_before = not_before

    def _held(self, entry_ids: Sequence[int], owner: str | None) -> list[_StoredEntry]:
        found = (self._stored.get(entry_id) for entry_id in entry_ids)
        return [s for s in found if s is not None and (owner is None or s.leased_by == owner)]

    async def dead_letter(self, entries: Sequence[tuple[int, str]], *, now: float) -> None:
        """Move ``(entry_id, reason)`` entries to the dead-letter store.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._check_open()
        for entry_id, reason in entries:
            stored = self._stored.pop(entry_id, None)
            if stored is None:
                continue
            self._payload_bytes -= len(stored.entry.payload)
            attempts = stored.entry.attempts + 1
            self._dead[entry_id] = _StoredEntry(
                entry=replace(stored.entry, attempts=attempts),
                not_before=stored.not_before,
                reason=reason,
                dead_at=now,
            )

    async def records(self, *, dead: bool, limit: int = 1000) -> list[OutboxRecord]:
        """Stored entries without payloads, oldest first (as :class:`georep.SqliteOutbox`)."""
        self._check_open()
        source = self._dead if dead else self._stored
        return [
            OutboxRecord(
                entry_id=entry_id,
                state="dead" if dead else "queued",
                channel=s.entry.channel,
                region=s.entry.region,
                size=len(s.entry.payload),
                enqueued_at=s.entry.enqueued_at,
                attempts=s.entry.attempts,
                reason=s.reason,
                dead_at=s.dead_at,
            )
            for entry_id, s in sorted(source.items())[:limit]
        ]

    async def dead_depth(self) -> int:
        """Dead-lettered entries."""
        self._check_open()
        return len(self._dead)

    async def replay(self, entry_ids: Sequence[int] | None = None, *, now: float) -> int:
        """Move dead-lettered entries back to the queue, due at once; return how many.

        Raises:
            OutboxFullError: The queue has no room for them; none is moved.
            ClosedError: The outbox was closed.
        """
        self._check_open()
        ids = sorted(self._dead if entry_ids is None else set(entry_ids) & set(self._dead))
        self._check_room(len(ids), sum(len(self._dead[i].entry.payload) for i in ids))
        for entry_id in ids:
            dead = self._dead.pop(entry_id)
            self._stored[entry_id] = _StoredEntry(replace(dead.entry, attempts=0), now)
            self._payload_bytes += len(dead.entry.payload)
        # Keep entry-id order (oldest first) after re-inserting old ids.
        self._stored = dict(sorted(self._stored.items()))
        return len(ids)

    async def purge(self, entry_ids: Sequence[int] | None = None) -> int:
        """Delete dead-lettered entries for good; return how many."""
        self._check_open()
        ids = list(self._dead) if entry_ids is None else [i for i in entry_ids if i in self._dead]
        for entry_id in ids:
            del self._dead[entry_id]
        return len(ids)

    async def depth(self, channel: str | None = None) -> int:
        """Entries stored for ``channel``, or in total (leased ones included).

        Raises:
            ClosedError: The outbox was closed.
        """
        self._check_open()
        if channel is None:
            return len(self._stored)
        return sum(1 for stored in self._stored.values() if stored.entry.channel == channel)

    async def _close(self) -> None:
        # The entries are dropped, as a file nobody opens again.
        self._stored.clear()
        self._dead.clear()
        self._payload_bytes = 0
