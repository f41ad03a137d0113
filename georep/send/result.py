"""What one GeoSender send is made of: its result, the counters, the messages' preparation.

Shared by the GeoSender's collaborators (the active and passive paths, scheduling, the
outbox link, the ledger records); none of them imports :mod:`georep.send.sender`.
"""

from __future__ import annotations

__all__ = [
    "MessagePrep",
    "PendingSend",
    "SendContext",
    "SendCounts",
    "SendResult",
    "SenderStats",
]

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any

from opentelemetry.trace import Span

from georep._channel import RegionPair
from georep._policy import DedupKey, FailoverPolicy
from georep._telemetry import SenderTelemetry
from georep.exceptions import InvalidMessageError
from georep.ports import Clock, MessageCodec, RegionSender
from georep.send.ordering import SessionSequencer

_TRACEPARENT = "traceparent"

_NO_FAILURES: Mapping[str, BaseException] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SendResult:
    """What happened to one ``send_messages`` call.

    Attributes:
        accepted: Regions that accepted the message(s), in the order they answered.
        failed: Each region that failed, with its error.
        failed_over: True when the active region failed and the backup accepted (passive).
        queued: True when the message(s) went to the durable outbox, because no region
            accepted (their errors are in ``failed``) or because an earlier message of
            their session waits there (``failed`` empty); the outbox sends them later, so
            the call still counts as delivered.
        repair_queued: Regions whose copy went to the outbox for a later resend (active
            mode with ``repair=True``).
        message_ids: The MessageId of every message sent, in order.
        skipped: Active mode: regions not tried because they failed moments ago (cool-down);
            their last error is in ``failed``.
    """

    accepted: tuple[str, ...]
    failed: Mapping[str, BaseException] = field(default_factory=lambda: _NO_FAILURES)
    failed_over: bool = False
    queued: bool = False
    repair_queued: tuple[str, ...] = ()
    message_ids: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


@dataclass(slots=True)
class SenderStats:
    """Counters of one GeoSender since it was created."""

    accepted: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    failovers: int = 0
    role_swaps: int = 0
    queued: int = 0
    outbox_depth: int | None = None
    drained: int = 0
    dead_lettered: int = 0
    expired: int = 0


@dataclass(slots=True)
class PendingSend:
    """One ``send_messages`` call on its way: what goes out and how it is bounded.

    Attributes:
        payload: What the first region gets (a message, a list or a batch).
        messages: The messages in it.
        timeout: The deadline per region attempt, in seconds.
        span: The call's span (``INVALID_SPAN`` when tracing is off).
        ids: The MessageIds, for the result.
    """

    payload: Any
    messages: Sequence[Any]
    timeout: float
    span: Span
    ids: tuple[str, ...] = ()


class SendCounts:
    """Counts messages per region and outcome, in the stats and the metrics."""

    __slots__ = ("_stats", "_telemetry")

    def __init__(self, stats: SenderStats, telemetry: SenderTelemetry) -> None:
        self._stats = stats
        self._telemetry = telemetry

    def accepted(self, region: str, count: int) -> None:
        accepted = self._stats.accepted
        accepted[region] = accepted.get(region, 0) + count
        self._telemetry.messages(count, region, "accepted")

    def failed(self, region: str, count: int) -> None:
        failed = self._stats.failed
        failed[region] = failed.get(region, 0) + count
        self._telemetry.messages(count, region, "failed")


class MessagePrep:
    """Gives messages their MessageId and traceparent, checks the dedup key, copies them."""

    __slots__ = ("_codec", "dedup_key", "sequencer")

    def __init__(
        self, codec: MessageCodec, dedup_key: DedupKey, sequencer: SessionSequencer | None = None
    ) -> None:
        self._codec = codec
        self.dedup_key = dedup_key
        self.sequencer = sequencer
        """Stamps each message with a session id with its order (see docs/sessions.md)."""

    def prepare_all(self, messages: Sequence[Any], traceparent: str | None) -> tuple[str, ...]:
        return tuple(self.prepare(message, traceparent) for message in messages)

    def prepare(self, message: Any, traceparent: str | None = None) -> str:
        """Give ``message`` a MessageId and a traceparent; check its dedup key; stamp its
        session order if it has a session id."""
        codec = self._codec
        message_id = codec.message_id(message)
        if not message_id:
            message_id = str(uuid.uuid4())
            codec.set_message_id(message, message_id)
        key = message_id
        if self.dedup_key.source == "subject":
            key = codec.subject(message) or ""
            if not key:
                raise InvalidMessageError(
                    "dedup_key is the subject but a message has none: set message.subject "
                    "(receivers would not recognise its copies)"
                )
        elif self.dedup_key.source == "application_property":
            name = self.dedup_key.name or ""
            value = codec.application_property(message, name)
            if value is None:
                raise InvalidMessageError(
                    f"dedup_key is application property {name!r} but a message lacks it: "
                    "set it on every message"
                )
            key = value.decode() if isinstance(value, bytes) else str(value)
        if self.sequencer is not None:
            session_id = codec.session_id(message)
            if session_id is not None:
                self.sequencer.stamp(
                    session_id,
                    key,
                    partial(codec.application_property, message),
                    partial(codec.set_application_property, message),
                )
        if traceparent is not None and codec.application_property(message, _TRACEPARENT) is None:
            codec.set_application_property(message, _TRACEPARENT, traceparent)
        return message_id

    def copy_payload(self, payload: Any, messages: Sequence[Any]) -> Any:
        """What to send to the second region: the same batch (immutable once built), a copy
        of a single message, or copies of a list."""
        if self._codec.is_batch(payload):
            return payload
        if isinstance(payload, list):
            return self.copies(messages)
        return self._codec.copy(payload)

    def copies(self, messages: Sequence[Any]) -> list[Any]:
        copy = self._codec.copy
        return [copy(message) for message in messages]


@dataclass(frozen=True, slots=True)
class SendContext:
    """What every collaborator of one GeoSender shares (given to each constructor).

    Attributes:
        regions: The two regions' channels.
        policy: When to fail over; the attempt deadline.
        codec: Splits, checks, encodes and copies messages.
        prep: Gives messages their ids; copies them.
        counts: Per-region message counters.
        stats: The sender's stats.
        telemetry: The sender's instruments.
        partitioned: The entity is partitioned (one partition key per list).
        entity: The entity, for messages.
        clock: Time source.
    """

    regions: RegionPair[RegionSender]
    policy: FailoverPolicy
    codec: MessageCodec
    prep: MessagePrep
    counts: SendCounts
    stats: SenderStats
    telemetry: SenderTelemetry
    partitioned: bool
    entity: str
    clock: Clock
