"""One ``GeoSender.send_messages`` call from end to end: check, prepare, send, record.

The path (active or passive) does the sending; this wraps it in what every send has:
validation before any network call, MessageIds and traceparent, the span, the duration
metric and the ledger row.
"""

from __future__ import annotations

__all__ = ["SendFlow"]

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from georep._telemetry import traceparent_of
from georep.send.records import SendRecords
from georep.send.result import PendingSend, SendContext, SendResult

if TYPE_CHECKING:
    from georep.outbox.enqueue import OutboxLink

_PRODUCER = SpanKind.PRODUCER


class SendFlow:
    """Runs each send through ``path``.

    Args:
        context: What the sender's collaborators share (regions, codec, telemetry...).
        path: The active or passive path's ``send``.
        records: The ledger rows (None: no ledger).
        outbox: The sender's outbox link (None: no outbox). While the outbox holds an
            earlier message of a send's session, the send is queued behind it rather
            than sent (docs/sessions.md §5).
    """

    def __init__(
        self,
        context: SendContext,
        path: Callable[[PendingSend], Awaitable[SendResult]],
        *,
        records: SendRecords | None,
        outbox: OutboxLink | None = None,
    ) -> None:
        self._context = context
        self._path = path
        self._records = records
        self._outbox = outbox

    async def send(self, message: Any, timeout: float) -> SendResult:
        """Send ``message`` (a message, a list or a batch) with ``timeout`` per attempt."""
        context = self._context
        codec = context.codec
        messages = codec.split(message)
        if not messages:
            return SendResult(accepted=())
        # Validated before any network call (issue 20): what no region would take is
        # raised here, never failed over or queued. A batch of create_message_batch had
        # each message checked and given its id as it was added: not again.
        one_partition, max_size = context.partitioned, context.regions.size_limit()
        prepared = codec.prepared_ids(message, one_partition=one_partition, max_size=max_size)
        if prepared is None:
            codec.check(messages, one_partition=one_partition, max_size=max_size)
        started = self._context.clock.monotonic()
        records = self._records
        wall_started = self._context.clock.time() if records is not None else 0.0
        telemetry = self._context.telemetry
        # start_span, not start_as_current_span: no context switch on the hot path. The span
        # still parents to the caller's current span and its context travels in traceparent.
        span = (
            telemetry.tracer.start_span(
                telemetry.span_name, kind=_PRODUCER, attributes=telemetry.span_attributes
            )
            if telemetry.tracing()
            else INVALID_SPAN
        )
        try:
            pending = self._pending(message, messages, timeout, span, prepared)
            outbox = self._outbox
            if outbox is not None and await outbox.holds_session_of(messages):
                result = await outbox.queue_behind(pending)
            else:
                result = await self._path(pending)
        except BaseException as exc:
            self._failed(span, exc, started, messages, wall_started)
            raise
        telemetry.duration(
            self._context.clock.monotonic() - started, "queued" if result.queued else "accepted"
        )
        span.end()
        if records is not None:
            records.sent(result, wall_started)
        return result

    def _pending(
        self,
        message: Any,
        messages: Sequence[Any],
        timeout: float,
        span: Span,
        prepared: tuple[str, ...] | None,
    ) -> PendingSend:
        """The call's messages given their ids (and traceparent), ready for the path.
        ``prepared``: the ids of a batch of ``create_message_batch``, sent as it is."""
        prep = self._context.prep
        traceparent = traceparent_of(span) if span is not INVALID_SPAN else None
        if prepared is not None:
            if traceparent is not None:
                # Not on the wire (the batch encoded each message as it was added), but in
                # what an outbox or a repair keeps of them: those copies carry the trace.
                prep.prepare_all(messages, traceparent)
            return PendingSend(message, messages, timeout, span, prepared)
        # A single message goes to the SDK as itself (as the codec read it: an AMQP
        # annotated message or a dict becomes the SDK's message): wrapped in a list it would
        # be re-encoded into a one-message batch, 64 bytes more on the wire than the SDK
        # sends for it, so a message just under the limit would be refused.
        if len(messages) == 1 and (messages[0] is message or self._single(message)):
            single = messages[0]
            ids = (prep.prepare(single, traceparent),)
            return PendingSend(single, messages, timeout, span, ids)
        # A batch the SDK built before we could give its messages ids is resent as a list
        # of its (now prepared) messages, so both regions see the same ids.
        return PendingSend(
            messages, messages, timeout, span, prep.prepare_all(messages, traceparent)
        )

    def _single(self, payload: Any) -> bool:
        """Whether ``payload`` is one message (not a list or a batch of one)."""
        if self._context.codec.is_batch(payload):
            return False
        return isinstance(payload, Mapping) or not isinstance(payload, Iterable)

    def _failed(
        self,
        span: Span,
        exc: BaseException,
        started: float,
        messages: Sequence[Any],
        wall_started: float,
    ) -> None:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.set_attribute("error.type", type(exc).__name__)
        self._context.telemetry.duration(self._context.clock.monotonic() - started, "failed")
        span.end()
        if self._records is not None:
            self._records.failed(messages, exc, wall_started)
