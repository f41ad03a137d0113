"""How the core reads and writes the messages it does not own."""

from __future__ import annotations

__all__ = ["MessageCodec"]

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class MessageCodec(Protocol):
    """How the core reads, copies, stores and batches the client library's messages."""

    def split(self, messages: Any) -> list[Any]:
        """The messages in ``messages``: a message, an iterable of messages, or a batch."""
        ...

    def is_batch(self, messages: Any) -> bool:
        """True when ``messages`` is a batch object (not a message or a list)."""
        ...

    def message_id(self, message: Any) -> str | None: ...

    def set_message_id(self, message: Any, message_id: str) -> None: ...

    def subject(self, message: Any) -> str | None: ...

    def session_id(self, message: Any) -> str | None:
        """The message's session id, if it has one (its order is then stamped)."""
        ...

    def application_property(self, message: Any, name: str) -> Any: ...

    def set_application_property(self, message: Any, name: str, value: str) -> None: ...

    def time_to_live(self, message: Any) -> float | None:
        """The message's time-to-live in seconds, or None when it has none."""
        ...

    def set_time_to_live(self, message: Any, seconds: float) -> None:
        """Set the message's time-to-live to ``seconds`` (positive)."""
        ...

    def copy(self, message: Any) -> Any:
        """An independent copy with the same body and properties (never the same object)."""
        ...

    def encode(self, message: Any) -> bytes:
        """Bytes that :meth:`decode` turns back into an equal message (for the outbox)."""
        ...

    def decode(self, payload: bytes) -> Any: ...

    def check(
        self, messages: Sequence[Any], *, one_partition: bool, max_size: int | None = None
    ) -> None:
        """Refuse, before anything is sent, what the service would refuse.

        SessionId and PartitionKey both set and different; with ``one_partition``, a list
        or batch whose messages carry different partition keys; identifiers, property
        types and body kinds the service (or a failover copy) cannot take; with
        ``max_size`` (bytes, the entity's limit when known), messages certainly over it.

        Raises:
            InvalidMessageError: naming the message and the fix.
        """
        ...

    def prepared_ids(
        self, payload: Any, *, one_partition: bool, max_size: int | None = None
    ) -> tuple[str, ...] | None:
        """For a batch made by :meth:`new_batch`, which checked every message as it was
        added (as :meth:`check` does) and took the MessageId ``prepare`` returned for it:
        those ids, in order, once the batch as a whole passes what :meth:`check` asks of
        the list (one partition key with ``one_partition``; within ``max_size``). None for
        anything else, or a batch over ``max_size``: :meth:`check` it message by message.

        Raises:
            InvalidMessageError: With ``one_partition``, the batch mixes partition keys.
        """
        ...

    def new_batch(self, max_size_in_bytes: int, prepare: Callable[[Any], object]) -> Any:
        """An empty batch for the caller to fill; ``prepare`` runs on every added message
        and returns its MessageId."""
        ...
