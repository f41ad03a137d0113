"""The delivery ledger's on-disk format, version 1 (SPEC §6).

A ledger is a directory with two Parquet datasets, one row per event:

``LEDGER_DIR/sends/*.parquet``
    One row per **logical** message a sender was asked to send (a list or batch of N
    messages writes N rows with the same timestamps).

``LEDGER_DIR/receives/*.parquet``
    One row per **copy** a receiver got from a region, whatever became of it.

Every file is complete when it appears (written under a temporary name, then renamed), so a
reader never sees half a file, and a crashed writer loses at most its unflushed buffer.
Columns only ever get added; a reader checks ``schema_version`` and ignores columns it does
not know. Times are UTC, microseconds. Nothing secret is stored: errors are recorded by
exception class name only.

This module holds the column lists and value sets in plain Python; :func:`send_schema` and
:func:`receive_schema` build the pyarrow schemas (pyarrow is imported only when called).
"""

from __future__ import annotations

__all__ = [
    "ORDER_GAPS",
    "RECEIVES_DIR",
    "RECEIVE_COLUMNS",
    "RECEIVE_OUTCOMES",
    "REGION_OUTCOMES",
    "SCHEMA_VERSION",
    "SENDS_DIR",
    "SEND_COLUMNS",
    "SEND_MODES",
    "SEND_OUTCOMES",
    "receive_schema",
    "send_schema",
]

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_VERSION: Final = 1
SENDS_DIR: Final = "sends"
RECEIVES_DIR: Final = "receives"

SEND_MODES: Final = ("active", "passive", "paired", "raw")
"""``raw``: a plain SDK sender measured beside georep (benchmarks)."""

SEND_OUTCOMES: Final = ("accepted", "queued", "failed", "expired")
"""``accepted``: a region stored it. ``queued``: no region did, the durable outbox holds it
(acknowledged to the caller all the same). ``failed``: the caller got an error, so the
message was never acknowledged and cannot count as lost. ``expired``: written by the outbox
drainer for a message whose ``time_to_live`` ran out while it waited in the outbox (a
``queued`` row for the same id precedes it): it was dropped, as the broker would have."""

REGION_OUTCOMES: Final = ("accepted", "failed", "skipped", "queued")
"""Per region tried: ``skipped`` is a region in cool-down (active mode); ``queued`` is a copy
put in the outbox for that region (active repair, or a target the drainer will retry)."""

RECEIVE_OUTCOMES: Final = ("processed", "suppressed", "failed", "dead_lettered", "deferred")
"""``processed``: the handler ran and succeeded, and the copy was completed.
``suppressed``: a duplicate, settled without calling the handler. ``failed``: the handler
raised or abandoned the copy; it was abandoned for redelivery. ``dead_lettered``: the copy
was dead-lettered (by its handler, after ``max_attempts`` failures, or as the twin of a
dead-lettered copy). ``deferred``: the copy was deferred (by its handler, or as the twin of
a deferred copy)."""

SEND_COLUMNS: Final = (
    ("schema_version", "int16", "always SCHEMA_VERSION"),
    ("message_id", "string", "the logical message's id (the dedup key's value)"),
    ("entity", "string", "queue or topic name"),
    ("mode", "string", "one of SEND_MODES"),
    ("outcome", "string", "one of SEND_OUTCOMES"),
    ("accepted_region", "string", "label of the first region that accepted; null if none"),
    ("failover", "bool", "the active region failed and another one accepted"),
    (
        "regions",
        "list<struct<region: string, outcome: string, error: string>>",
        "every region tried, in order, with one of REGION_OUTCOMES; error = exception class",
    ),
    ("started_at", "timestamp[us, UTC]", "send_messages called"),
    ("finished_at", "timestamp[us, UTC]", "send_messages returned or raised"),
    ("process_id", "int32", "the writer's PID"),
    ("host", "string", "the writer's host name"),
)

RECEIVE_COLUMNS: Final = (
    ("schema_version", "int16", "always SCHEMA_VERSION"),
    ("message_id", "string", "the copy's dedup key value"),
    ("entity", "string", "queue, or topic/Subscriptions/name"),
    ("region", "string", "label of the region the copy came from"),
    ("outcome", "string", "one of RECEIVE_OUTCOMES"),
    ("delivery_count", "int32", "the broker's delivery count for this copy"),
    ("enqueued_at", "timestamp[us, UTC]", "the region stored it (broker time); may be null"),
    ("received_at", "timestamp[us, UTC]", "the receiver got the copy"),
    ("settled_at", "timestamp[us, UTC]", "completed/abandoned; null if never settled"),
    ("process_id", "int32", "the writer's PID"),
    ("host", "string", "the writer's host name"),
    ("session_id", "string", "the copy's session id; null without one"),
    ("order_writer", "string", "its georep.order.writer stamp (docs/sessions.md); null if none"),
    ("order_seq", "int64", "its georep.order.seq stamp: its number in the session, per writer"),
    (
        "order_gap",
        "string",
        "session mode: null, or why it was handed on without its predecessor processed "
        "(one of ORDER_GAPS)",
    ),
    ("order_wait", "double", "session mode: seconds it waited for its predecessor"),
    (
        "finished_at",
        "timestamp[us, UTC]",
        "the handler returned (a copy settled without the handler: the receiver was done "
        "with it, outcome recorded), settled or not",
    ),
)

ORDER_GAPS: Final = ("timeout", "absent")
"""``timeout``: ``order_wait`` ran out while its predecessor was in a region that did not
answer (or held by another consumer). ``absent``: no region held its predecessor."""


_NOT_NULL: Final = frozenset({"schema_version", "message_id"})


def _schema(columns: tuple[tuple[str, str, str], ...], files: str) -> pa.Schema:
    """The pyarrow schema of ``columns`` (a table above), for ``files`` (sends, receives)."""
    import pyarrow as pa

    region = pa.struct([("region", pa.string()), ("outcome", pa.string()), ("error", pa.string())])
    types = {
        "int16": pa.int16(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "double": pa.float64(),
        "bool": pa.bool_(),
        "string": pa.string(),
        "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
        "list<struct<region: string, outcome: string, error: string>>": pa.list_(region),
    }
    return pa.schema(
        [pa.field(name, types[kind], nullable=name not in _NOT_NULL) for name, kind, _ in columns],
        metadata={"georep.ledger": files, "georep.schema_version": str(SCHEMA_VERSION)},
    )


def send_schema() -> pa.Schema:
    """The pyarrow schema of ``sends`` files."""
    return _schema(SEND_COLUMNS, "sends")


def receive_schema() -> pa.Schema:
    """The pyarrow schema of ``receives`` files."""
    return _schema(RECEIVE_COLUMNS, "receives")
