"""Session order stamps: what a GeoSender writes so a GeoReceiver can restore session order.

Service Bus orders a session's messages only inside one namespace. When a session's stream
moves between regions (a passive failover, a copy missing in one region in active mode),
the receiver needs to know, for each message, which message of the session came before it.
The sender stamps, as application properties under georep's prefix ``georep.``:

- ``georep.order.writer``: the writer (one per GeoSender object) that numbered it;
- ``georep.order.seq``: its place in the session, per writer (1, 2, 3, ...);
- ``georep.order.prev``: the dedup key of the writer's previous message of the session
  (absent on the writer's first one): the receiver waits until that key is processed;
- ``georep.order.generation``: the role generation when it was sent (which region was
  active), for the audit.

See docs/sessions.md for what order means with several writers, and its limits.
"""

from __future__ import annotations

__all__ = [
    "GENERATION_PROPERTY",
    "PREV_PROPERTY",
    "SEQ_PROPERTY",
    "WRITER_PROPERTY",
    "OrderStamp",
    "SessionSequencer",
    "read_stamp",
]

import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from georep.ports import OrderStamp

WRITER_PROPERTY: Final = "georep.order.writer"
SEQ_PROPERTY: Final = "georep.order.seq"
PREV_PROPERTY: Final = "georep.order.prev"
GENERATION_PROPERTY: Final = "georep.order.generation"

MAX_SESSIONS_TRACKED: Final = 100_000
"""Sessions one writer remembers (least recently written forgotten first). A session
forgotten and written again starts a new chain: its next message does not wait for the
earlier ones."""


def read_stamp(get: Callable[[str], Any]) -> OrderStamp | None:
    """The stamp of a message whose application property ``name`` is ``get(name)``.

    None when the message carries no (readable) stamp: it is not ordered, and is handled
    as soon as it arrives.
    """
    writer, seq = get(WRITER_PROPERTY), get(SEQ_PROPERTY)
    if writer is None or seq is None:
        return None
    try:
        number = int(_text(seq))
        generation = int(_text(get(GENERATION_PROPERTY) or 0))
    except ValueError:
        return None
    prev = get(PREV_PROPERTY)
    return OrderStamp(_text(writer), number, None if prev is None else _text(prev), generation)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class SessionSequencer:
    """Numbers one writer's messages per session and stamps them (the sender's half).

    Not thread-safe: a GeoSender prepares messages on its event loop's thread.

    Args:
        generation: The role generation now (read at each stamp).
        writer: This writer's id (default: a new UUID).
    """

    __slots__ = ("_generation", "_last", "writer")

    def __init__(self, generation: Callable[[], int], writer: str | None = None) -> None:
        self._generation = generation
        self.writer = writer or uuid.uuid4().hex
        # session id -> (last seq, its dedup key, its prev), least recently written first.
        self._last: OrderedDict[str, tuple[int, str, str | None]] = OrderedDict()

    def stamp(
        self,
        session_id: str,
        key: str,
        get: Callable[[str], Any],
        put: Callable[[str, str], None],
    ) -> None:
        """Stamp the message whose dedup key is ``key`` as the session's next one.

        A message that already carries this writer's stamp (a send retried with the same
        message object) keeps it, so a retry does not open a gap.
        """
        existing = read_stamp(get)
        if existing is not None and existing.writer == self.writer:
            return
        last = self._last.pop(session_id, None)
        if last is not None and last[1] == key:
            # The same message again (a retry with a new object but the same dedup key):
            # the same place in the session, never a successor of itself.
            seq, prev = last[0], last[2]
        else:
            seq, prev = (1, None) if last is None else (last[0] + 1, last[1])
        put(WRITER_PROPERTY, self.writer)
        put(SEQ_PROPERTY, str(seq))
        if prev is not None:
            put(PREV_PROPERTY, prev)
        put(GENERATION_PROPERTY, str(self._generation()))
        self._last[session_id] = (seq, key, prev)
        if len(self._last) > MAX_SESSIONS_TRACKED:
            self._last.popitem(last=False)
