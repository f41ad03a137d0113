"""The GeoSender's ledger rows: one :class:`~georep.ports.SendRecord` per send."""

from __future__ import annotations

__all__ = ["SendRecords", "error_name", "flush_ledger"]

import logging
from collections.abc import Collection, Sequence
from typing import Any

from georep.exceptions import AllRegionsUnavailableError, RegionError
from georep.ports import Clock, ErrorKind, Ledger, MessageCodec, RegionAttempt, SendRecord
from georep.send.result import SendResult

_log = logging.getLogger("georep.sender")


def error_name(error: BaseException) -> str:
    """How the ledger names an error: its class, never its message (it may hold a secret)."""
    return type(error).__name__


async def flush_ledger(ledger: Ledger | None, *, timeout: float, clock: Clock) -> None:
    """Flush ``ledger`` (a sender's ``aclose``) within ``timeout`` seconds. Never raises."""
    if ledger is None:
        return
    try:
        with clock.deadline(timeout):
            await ledger.flush()
    except Exception as exc:
        _log.warning("flushing the ledger failed: %s", type(exc).__name__)


class SendRecords:
    """Writes what each send did to ``ledger``.

    Args:
        ledger: Where the rows go (the caller owns it).
        entity: The entity sent to.
        mode: ``"active"`` or ``"passive"``.
        labels: The region labels, primary first (the fixed order of active attempts).
        fail_over_on: The kinds that mean "unavailable" (what an active send queued).
        codec: Reads MessageIds of failed sends.
        clock: Wall-clock times of the rows.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        entity: str,
        mode: str,
        labels: tuple[str, str],
        fail_over_on: Collection[ErrorKind],
        codec: MessageCodec,
        clock: Clock,
    ) -> None:
        self.ledger = ledger
        self._entity = entity
        self._mode = mode
        self._active = mode == "active"
        self._labels = labels
        self._fail_over_on = fail_over_on
        self._codec = codec
        self._clock = clock
        first, second = labels
        first_ok, second_ok = RegionAttempt(first, "accepted"), RegionAttempt(second, "accepted")
        self._all_accepted: dict[tuple[str, ...], tuple[RegionAttempt, ...]] = {
            (first,): (first_ok,),
            (second,): (second_ok,),
            (first, second): (first_ok, second_ok),
        }

    def sent(self, result: SendResult, started_at: float) -> None:
        """A send that returned ``result``."""
        accepted = result.accepted
        if not result.failed:
            # Every region tried accepted (the common case): a prebuilt tuple, no allocation;
            # or none was tried (queued behind an earlier message of its session).
            attempts: Sequence[RegionAttempt] = self._all_accepted[accepted] if accepted else ()
            failover = False
        else:
            attempts, failover = self._attempts(result)
        # Positional: this runs on every send.
        self.ledger.record_send(
            SendRecord(
                result.message_ids,
                self._entity,
                self._mode,
                "queued" if result.queued else "accepted",
                accepted[0] if accepted else None,
                failover,
                attempts,
                started_at,
                self._clock.time(),
            )
        )

    def expired(self, message_id: str, at: float) -> None:
        """A message the outbox dropped at ``at``: its time-to-live ran out as it waited."""
        row = SendRecord(
            (message_id,), self._entity, self._mode, "expired", None, False, (), at, at
        )
        self.ledger.record_send(row)

    def _attempts(self, result: SendResult) -> tuple[list[RegionAttempt], bool]:
        """What each region did in a send that met a failure, and whether it failed over."""
        attempts: list[RegionAttempt] = []
        if self._active:
            # Both regions are tried at once: list them in a fixed order.
            for label in self._labels:
                if label in result.accepted:
                    attempts.append(RegionAttempt(label, "accepted"))
                elif label in result.failed:
                    outcome = "skipped" if label in result.skipped else "failed"
                    error = error_name(result.failed[label])
                    attempts.append(RegionAttempt(label, outcome, error))
            queued = result.repair_queued
            if result.queued:
                transient = self._fail_over_on
                queued = tuple(
                    label
                    for label, error in result.failed.items()
                    if getattr(error, "kind", None) in transient
                )
            attempts.extend(RegionAttempt(label, "queued") for label in queued)
            return attempts, bool(result.accepted)
        attempts.extend(
            RegionAttempt(label, "failed", error_name(error))
            for label, error in result.failed.items()
        )
        attempts.extend(RegionAttempt(label, "accepted") for label in result.accepted)
        if result.queued:  # the outbox sends it to whichever region accepts
            attempts.append(RegionAttempt(None, "queued"))
        return attempts, result.failed_over

    def failed(self, messages: Sequence[Any], error: BaseException, started_at: float) -> None:
        """A send that raised ``error``."""
        if isinstance(error, AllRegionsUnavailableError):
            causes = error.causes
            # Passive causes are in the order tried; active ones in the fixed region order.
            order = self._labels if self._active else causes
            attempts = [
                RegionAttempt(label, "failed", error_name(causes[label]))
                for label in order
                if label in causes
            ]
        elif isinstance(error, RegionError):
            attempts = [RegionAttempt(error.region, "failed", error_name(error))]
        else:
            attempts = []
        message_id = self._codec.message_id
        self.ledger.record_send(
            SendRecord(
                message_ids=tuple(message_id(message) or "" for message in messages),
                entity=self._entity,
                mode=self._mode,
                outcome="failed",
                accepted_region=None,
                failover=False,
                regions=attempts,
                started_at=started_at,
                finished_at=self._clock.time(),
            )
        )
