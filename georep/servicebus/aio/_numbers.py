"""The sequence numbers the drop-in client hands out: the region's own, marked by region.

Each region numbers its copies itself, so two different messages can carry one number (one
per region) and one message's copies carry two. The client hands out the primary's numbers
as the primary gave them and the secondary's with bit 62 set. So a number names one message
in either region, and any process (or the same one after a restart) can tell from the number
alone which region to ask for which of its numbers: ``receive_deferred_messages`` needs no
memory of who handed what out. A partitioned entity's partition id is in bits 48-63, and
never reaches bit 62 (a few dozen partitions at most); numbers stay positive 64-bit integers.
"""

from __future__ import annotations

__all__ = ["SECONDARY_MARK", "handed_out", "mark", "own_number", "region_of"]

import contextlib
from typing import Any, Final

from georep.send.schedule import SECONDARY_FLAG

SECONDARY_MARK: Final = SECONDARY_FLAG
"""The bit set on the numbers of the secondary's messages: the one the sender's scheduled
numbers carry (:data:`georep.send.schedule.SECONDARY_FLAG`)."""
_SECONDARY: Final = "secondary"
_SEQUENCE_NUMBER: Final = b"x-opt-sequence-number"


def handed_out(region: str, own: int) -> int:
    """The number a message numbered ``own`` in ``region`` is handed out with."""
    return own | SECONDARY_MARK if region == _SECONDARY else own


def region_of(number: int) -> str:
    """The region a handed-out number belongs to (unmarked numbers: the primary)."""
    return _SECONDARY if number & SECONDARY_MARK else "primary"


def own_number(number: int) -> int:
    """The region's own number behind a handed-out one."""
    return number & ~SECONDARY_MARK


def mark(message: Any, region: str) -> Any:
    """Show ``message`` (a copy from ``region``) with its handed-out number; idempotent."""
    raw = getattr(message, "_raw_amqp_message", None)
    annotations = getattr(raw, "annotations", None)
    if isinstance(annotations, dict):
        own = annotations.get(_SEQUENCE_NUMBER)
        if own is not None:
            annotations[_SEQUENCE_NUMBER] = handed_out(region, int(own))
        return message
    own = getattr(message, "sequence_number", None)
    if own is not None:
        # A read-only message type is shown as its region numbered it.
        with contextlib.suppress(AttributeError):
            message.sequence_number = handed_out(region, int(own))
    return message
