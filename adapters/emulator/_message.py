"""One stored copy of a message, and the states it goes through in the broker.

Below the broker (``_broker``) and what the broker calls (subscription rules in
``_rules``, sessions in ``_sessions``), so that they all share the type without
importing each other.
"""

from __future__ import annotations

__all__ = ["MessageState", "StoredMessage"]

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from ._codec import (
    SECTION_MESSAGE_ANNOTATIONS,
    Symbol,
    Timestamp,
    encode_header_section,
    encode_map_entries,
    encode_map_section,
)


class MessageState(StrEnum):
    """Where a stored message is in its life."""

    AVAILABLE = "available"
    """Waiting for a receiver."""
    LOCKED = "locked"
    """Delivered in peek-lock mode; settles or returns when the lock expires."""
    DEFERRED = "deferred"
    """Set aside by its receiver; retrievable only by sequence number."""
    SCHEDULED = "scheduled"
    """Enqueued for a future time."""
    GONE = "gone"
    """Completed, expired, moved or purged."""


# x-opt-message-state as the service sends it (the SDK's ServiceBusMessageState values).
_WIRE_STATES: Final[dict[MessageState, int]] = {
    MessageState.DEFERRED: 1,
    MessageState.SCHEDULED: 2,
}


@dataclass(slots=True, eq=False)
class StoredMessage:
    """One copy of a message in one entity (a queue, a subscription, or a dead-letter queue)."""

    sequence_number: int
    message_id: Any
    bare: bytes
    annotation_entries: bytes
    annotation_count: int
    durable: bool
    priority: int | None
    ttl_ms: int | None
    content_type: str | None
    session_id: str | None
    partition_key: str | None
    enqueued_at: float
    expires_at: float | None
    scheduled_at: float | None = None
    delivery_count: int = 0
    state: MessageState = MessageState.AVAILABLE
    lock_token: uuid.UUID | None = None
    locked_until: float = 0.0
    dead_letter_source: str | None = None
    fragment: int | None = None
    """The fragment (partition) of a partitioned entity holding this message, else None."""

    @property
    def size(self) -> int:
        return len(self.bare) + len(self.annotation_entries)

    def encode(
        self, *, lock_token: uuid.UUID | None = None, extra: dict[str, Any] | None = None
    ) -> bytes:
        """Encode for delivery: header and broker annotations, then the bare message."""
        annotations: dict[Any, Any] = {
            Symbol("x-opt-sequence-number"): self.sequence_number,
            Symbol("x-opt-enqueued-time"): Timestamp(int(self.enqueued_at * 1000)),
        }
        if lock_token is not None:
            annotations[Symbol("x-opt-locked-until")] = Timestamp(int(self.locked_until * 1000))
            annotations[Symbol("x-opt-lock-token")] = lock_token
        if self.dead_letter_source is not None:
            annotations[Symbol("x-opt-deadletter-source")] = self.dead_letter_source
        wire_state = _WIRE_STATES.get(self.state)
        if wire_state is not None:  # absent means active, as the SDK reads it
            annotations[Symbol("x-opt-message-state")] = wire_state
        if extra:
            annotations.update(extra)
        header = encode_header_section(
            self.durable, self.priority, self.ttl_ms, self.delivery_count
        )
        section = encode_map_section(
            SECTION_MESSAGE_ANNOTATIONS,
            self.annotation_entries + encode_map_entries(annotations),
            self.annotation_count + len(annotations) * 2,
        )
        return header + section + self.bare
