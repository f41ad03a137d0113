"""Peeking that does not stop short: a partitioned entity answers one fragment at a time."""

from __future__ import annotations

__all__ = ["peek_all"]

from typing import Any

from georep.exceptions import ConfigurationError


async def peek_all(
    receiver: Any, count: int, *, from_sequence_number: int = 1, timeout: float | None = None
) -> list[Any]:
    """Peek up to ``count`` messages, looping until there are ``count`` or no more.

    ``receiver.peek_messages`` may return fewer messages than asked even when more exist
    (a partitioned entity answers from one fragment at a time; the service also caps an
    answer's total size), so a caller that wants N must loop: this does.

    Args:
        receiver: An ``azure.servicebus.aio.ServiceBusReceiver`` (anything with the same
            ``peek_messages(max_message_count, *, sequence_number, timeout)``).
        count: How many messages to return at most.
        from_sequence_number: The sequence number to start browsing from.
        timeout: Seconds per peek call, passed to the SDK.

    Returns:
        The peeked messages in sequence-number order (not locked, not removed).

    Raises:
        ConfigurationError: ``count`` is not positive (a ValueError, as the SDK raises).
    """
    if count < 1:
        raise ConfigurationError(f"count must be at least 1, got {count!r}")
    peeked: list[Any] = []
    next_sequence = from_sequence_number
    while len(peeked) < count:
        batch = await receiver.peek_messages(
            max_message_count=count - len(peeked), sequence_number=next_sequence, timeout=timeout
        )
        if not batch:
            break
        peeked.extend(batch)
        next_sequence = int(batch[-1].sequence_number) + 1
    return peeked
