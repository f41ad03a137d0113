"""The delivery ledger: one record per send and per received copy."""

from __future__ import annotations

__all__ = ["Ledger", "ReceiveRecord", "RegionAttempt", "SendRecord"]

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable


class RegionAttempt(NamedTuple):
    """What one region did with a send (the ``regions`` column of the ledger).

    Attributes:
        region: The region's label; None for a copy queued for "whichever region accepts"
            (the passive outbox).
        outcome: One of ``georep.ledger.schema.REGION_OUTCOMES``.
        error: The exception's class name when the region failed or was skipped.
    """

    region: str | None
    outcome: str
    error: str | None = None


class SendRecord(NamedTuple):
    """One ``send_messages`` call; the ledger writes one row per message id.

    Times are wall-clock seconds since the epoch (``Clock.time()``).
    """

    message_ids: Sequence[str]
    entity: str
    mode: str
    outcome: str
    accepted_region: str | None
    failover: bool
    regions: Sequence[RegionAttempt]
    started_at: float
    finished_at: float


class ReceiveRecord(NamedTuple):
    """One copy a receiver got from a region, and what became of it.

    Times are wall-clock seconds since the epoch; ``enqueued_at`` is the broker's.
    """

    message_id: str
    entity: str
    region: str
    outcome: str
    delivery_count: int
    enqueued_at: float | None
    received_at: float
    settled_at: float | None
    session_id: str | None = None
    """The copy's session id, if any."""
    order_writer: str | None = None
    """Its ``georep.order.writer`` stamp, if any."""
    order_seq: int | None = None
    """Its ``georep.order.seq`` stamp (its number in the session, per writer), if any."""
    order_gap: str | None = None
    """Session mode: why it was handed on without its predecessor (``timeout``: order_wait
    ran out; ``absent``: no region held it), or None."""
    order_wait: float = 0.0
    """Session mode: seconds it waited for its predecessor."""
    finished_at: float | None = None
    """When the handler returned (a copy settled without the handler: when the receiver was
    done with it, its outcome recorded), settled or not."""


@runtime_checkable
class Ledger(Protocol):
    """Where senders and receivers record what happened to each message (SPEC §6).

    ``record_*`` are called on the event loop's thread, on every send and settled copy: they
    must be cheap, synchronous and never block or raise (a full buffer drops and counts).
    Senders and receivers :meth:`flush` a ledger they were given when they close; the
    caller owns it and closes it. :class:`georep.ParquetLedger` writes Parquet files;
    ``georep.testing.InMemoryLedger`` keeps rows in lists.
    """

    def record_send(self, record: SendRecord) -> None:
        """Buffer one send call (one row per message id)."""
        ...

    def record_receive(self, record: ReceiveRecord) -> None:
        """Buffer one received copy."""
        ...

    async def flush(self) -> None:
        """Write everything buffered so far."""
        ...

    async def aclose(self) -> None:
        """Flush and stop. Idempotent."""
