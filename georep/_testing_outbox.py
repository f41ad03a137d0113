"""An in-memory :class:`georep.ports.Outbox` for unit tests: same rules, no I/O, no durability."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from georep._outbox import check_claim_arguments, check_outbox_bounds, outbox_full_error
from georep.exceptions import ClosedError
from georep.ports import OutboxEntry

__all__ = ["InMemoryOutbox"]


@dataclass(slots=True)
class _StoredEntry:
    # Mutable on purpose: claims and retries change the lease and due time in place.
    entry: OutboxEntry
    not_before: float
    leased_until: float = 0.0


class InMemoryOutbox:
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
        self._payload_bytes = 0
        self._next_entry_id = 1
        self._closed = False

    @property
    def last_known_depth(self) -> int:
        """Total entries stored (always current: nothing else writes this store)."""
        return len(self._stored)

    async def __aenter__(self) -> InMemoryOutbox:
        self._ensure_open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def put(
        self, channel: str, items: Sequence[tuple[str | None, bytes]], *, now: float
    ) -> list[int]:
        """Store ``(region, payload)`` items all or none; return their entry ids.

        Raises:
            OutboxFullError: Storing them would exceed ``max_entries`` or ``max_bytes``;
                none is stored.
            ClosedError: The outbox was closed.
        """
        self._ensure_open()
        payloads = [(region, bytes(payload)) for region, payload in items]
        new_bytes = sum(len(payload) for _, payload in payloads)
        if (
            len(self._stored) + len(payloads) > self._max_entries
            or self._payload_bytes + new_bytes > self._max_bytes
        ):
            raise outbox_full_error(
                store="in-memory outbox",
                entries=len(self._stored),
                payload_bytes=self._payload_bytes,
                new_entries=len(payloads),
                new_bytes=new_bytes,
                max_entries=self._max_entries,
                max_bytes=self._max_bytes,
            )
        entry_ids: list[int] = []
        for region, payload in payloads:
            entry_id = self._next_entry_id
            self._next_entry_id += 1
            self._stored[entry_id] = _StoredEntry(
                entry=OutboxEntry(
                    entry_id=entry_id,
                    channel=channel,
                    region=region,
                    payload=payload,
                    enqueued_at=now,
                    attempts=0,
                ),
                not_before=now,
            )
            entry_ids.append(entry_id)
        self._payload_bytes += new_bytes
        return entry_ids

    async def claim(
        self, channel: str, *, limit: int, now: float, lease: float
    ) -> list[OutboxEntry]:
        """Lease up to ``limit`` due, unleased entries of ``channel``, oldest first.

        Raises:
            ConfigurationError: ``limit`` is below 1 or ``lease`` is not positive.
            ClosedError: The outbox was closed.
        """
        self._ensure_open()
        check_claim_arguments(limit=limit, lease=lease)
        claimed: list[OutboxEntry] = []
        for stored in self._stored.values():
            if len(claimed) == limit:
                break
            if (
                stored.entry.channel == channel
                and stored.not_before <= now
                and stored.leased_until <= now
            ):
                stored.leased_until = now + lease
                claimed.append(stored.entry)
        return claimed

    async def delete(self, entry_ids: Sequence[int]) -> None:
        """Remove delivered entries; ids no longer stored are ignored.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._ensure_open()
        for entry_id in entry_ids:
            stored = self._stored.pop(entry_id, None)
            if stored is not None:
                self._payload_bytes -= len(stored.entry.payload)

    async def retry_later(self, entry_ids: Sequence[int], *, not_before: float) -> None:
        """Count a failed attempt, drop the lease, and make them due again at ``not_before``.

        Raises:
            ClosedError: The outbox was closed.
        """
        self._ensure_open()
        for entry_id in entry_ids:
            stored = self._stored.get(entry_id)
            if stored is None:
                continue
            stored.entry = replace(stored.entry, attempts=stored.entry.attempts + 1)
            stored.leased_until = 0.0
            stored.not_before = not_before

    async def depth(self, channel: str | None = None) -> int:
        """Entries stored for ``channel``, or in total (leased ones included).

        Raises:
            ClosedError: The outbox was closed.
        """
        self._ensure_open()
        if channel is None:
            return len(self._stored)
        return sum(1 for stored in self._stored.values() if stored.entry.channel == channel)

    async def aclose(self) -> None:
        """Mark the outbox closed (its entries are dropped); idempotent."""
        self._closed = True
        self._stored.clear()
        self._payload_bytes = 0

    def _ensure_open(self) -> None:
        if self._closed:
            raise ClosedError("in-memory outbox is closed; create a new InMemoryOutbox")
