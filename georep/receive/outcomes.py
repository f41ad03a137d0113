"""What a received copy's handler decided, and how the seen-set records it.

The handler settles through :meth:`georep.GeoReceiver.complete_message` and its siblings;
those only record a :class:`Decision` here. The receiver applies it after the handler
returns: the seen-set first (so the twin copy in the other region gets the same outcome),
then the broker.
"""

from __future__ import annotations

__all__ = [
    "MAX_ATTEMPTS_REASON",
    "PING_CONTENT_TYPE",
    "TWIN_DESCRIPTION",
    "Decision",
    "Decisions",
    "Settle",
    "check_commit",
    "dead_letter_decision",
    "max_attempts_decision",
    "twin_reason",
]

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from georep.exceptions import AlreadySettledError, ConfigurationError
from georep.ports import FINAL_STATES, ClaimState

PING_CONTENT_TYPE: Final = "application/vnd.ms-servicebus-ping"
"""The paired namespaces' ping (SPEC §3): completed by the receiver, never handled."""

MAX_ATTEMPTS_REASON: Final = "georep:max-attempts"
"""DeadLetterReason of a copy whose handler failed ``max_attempts`` times."""

TWIN_REASON_PREFIX: Final = "georep:twin:"
"""DeadLetterReason prefix of a copy dead-lettered because its twin was."""

REASON_LIMIT: Final = 4096
"""Characters of a dead-letter reason kept in the seen-set, for the twin's (the copy
dead-lettered by the handler gets the reason whole, as the SDK sends it)."""

DESCRIPTION_LIMIT: Final = 4096
"""Characters of a dead-letter description kept in the seen-set, for the twin's."""

_DESCRIPTION_MARK: Final = "\x1f"
"""Between a recorded reason and its description (an ASCII unit separator)."""

TWIN_DESCRIPTION: Final = "georep: another copy of this message"
"""How the description georep gives a twin whose original had none begins."""


class Settle(enum.StrEnum):
    """How a copy is settled with the broker."""

    COMPLETE = "complete"
    ABANDON = "abandon"
    DEFER = "defer"
    DEAD_LETTER = "dead_letter"


_STATES: Final = {
    Settle.COMPLETE: ClaimState.DONE,
    Settle.ABANDON: None,
    Settle.DEFER: ClaimState.DEFERRED,
    Settle.DEAD_LETTER: ClaimState.DEAD_LETTERED,
}
"""What the seen-set records for a copy settled each way (None: the claim is released)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One copy's outcome.

    Attributes:
        settle: What to do with the copy at the broker.
        reason: The DeadLetterReason (``DEAD_LETTER`` only).
        description: The DeadLetterErrorDescription (``DEAD_LETTER`` only).
        returned: Handed back unprocessed (``ABANDON`` only): a pull receiver closing
            with the copy never handed to the application. Not a failed attempt, so it
            never counts towards ``max_attempts``.
    """

    settle: Settle
    reason: str | None = None
    description: str | None = None
    returned: bool = False

    @property
    def state(self) -> ClaimState | None:
        """What the seen-set records for it (None: release the claim)."""
        return _STATES[self.settle]

    @property
    def recorded_reason(self) -> str:
        """What the seen-set keeps of a dead-letter decision: its reason and, after a
        separator, its description (bounded), so that the twin gets both
        (:func:`twin_reason`)."""
        reason = (self.reason or "")[:REASON_LIMIT]
        if not self.description:
            return reason
        return f"{reason}{_DESCRIPTION_MARK}{self.description[:DESCRIPTION_LIMIT]}"

    async def apply(self, region: Any, message: Any) -> None:
        """Settle ``message`` this way with ``region`` (the region receiver it came from)."""
        if self.settle is Settle.COMPLETE:
            await region.complete(message)
        elif self.settle is Settle.ABANDON:
            # A copy handed back unseen is released where the region can (AMQP
            # ``released``: not a delivery attempt, as the SDK hands back its buffer).
            release = getattr(region, "release", None) if self.returned else None
            if release is not None:
                await release(message)
            else:
                await region.abandon(message)
        elif self.settle is Settle.DEFER:
            await region.defer(message)
        else:
            await region.dead_letter(message, self.reason, self.description)


COMPLETE: Final = Decision(Settle.COMPLETE)
ABANDON: Final = Decision(Settle.ABANDON)
RETURNED: Final = Decision(Settle.ABANDON, returned=True)
"""Abandoned without having been processed (see :attr:`Decision.returned`)."""


def twin_reason(state: ClaimState, recorded: str | None) -> Decision:
    """The decision for a copy whose twin was settled with ``state`` already.

    A dead-lettered twin gets the original's reason after :data:`TWIN_REASON_PREFIX`, and
    the original's description (``recorded`` is :attr:`Decision.recorded_reason`), or one
    that says why when the original had none.
    """
    if state is ClaimState.DEFERRED:
        return Decision(Settle.DEFER)
    if state is ClaimState.DEAD_LETTERED:
        # The twin's reason is the prefix and the original's (none: the prefix alone,
        # which the drop-in client shows as no reason, as the original has none).
        reason, _, description = (recorded or "").partition(_DESCRIPTION_MARK)
        return Decision(
            Settle.DEAD_LETTER,
            reason=f"{TWIN_REASON_PREFIX}{reason}",
            description=description
            or (
                f"{TWIN_DESCRIPTION} (same dedup key: its twin from the other region, or an "
                f"earlier copy) was dead-lettered with reason {reason or '(none given)'!r}"
            ),
        )
    return COMPLETE


class Decisions:
    """The decisions of the handlers running now, keyed by the message object given.

    A handler may decide once, and only about the message it was given.
    """

    def __init__(self) -> None:
        self._open: dict[int, Decision | None] = {}

    def begin(self, message: Any) -> None:
        """``message`` is being handed to a handler: it may be decided now."""
        self._open[id(message)] = None

    def end(self, message: Any) -> Decision | None:
        """The handler returned: its decision (None: it made none)."""
        return self._open.pop(id(message), None)

    def decide(self, message: Any, decision: Decision) -> None:
        """Record ``decision`` for ``message``.

        Raises:
            AlreadySettledError: ``message`` is not being handled now (its handler returned
                and it was settled, or it was never given to one), or was decided already.
        """
        key = id(message)
        if key not in self._open:
            raise AlreadySettledError(
                f"{decision.settle}_message: this message is not one a handler of this "
                "GeoReceiver is processing now (decide on the message your handler was "
                "given, before the handler returns)"
            )
        earlier = self._open[key]
        if earlier is not None:
            raise AlreadySettledError(
                f"{decision.settle}_message: the handler already called "
                f"{earlier.settle}_message for this message (one decision per message)"
            )
        self._open[key] = decision


def dead_letter_decision(reason: str | None, error_description: str | None) -> Decision:
    """A handler's dead-letter decision: its reason and description as given (None: the
    copy gets none, as the SDK sends none); the seen-set keeps them bounded for the twin
    (:attr:`Decision.recorded_reason`)."""
    return Decision(
        Settle.DEAD_LETTER,
        reason=None if reason is None else str(reason),
        description=None if error_description is None else str(error_description),
    )


def max_attempts_decision(
    delivery_count: int, max_attempts: int, error: BaseException | None
) -> Decision:
    """Dead-letter a copy whose handler failed ``max_attempts`` times.

    The description names the last error's class only: its text may carry secrets.
    """
    cause = "the handler abandoned it" if error is None else f"last error: {type(error).__name__}"
    return Decision(
        Settle.DEAD_LETTER,
        reason=MAX_ATTEMPTS_REASON,
        description=(
            f"georep: the handler failed on delivery {delivery_count} "
            f"(max_attempts={max_attempts}); {cause}"
        ),
    )


LEDGER_OUTCOMES: Final = {
    Settle.COMPLETE: "processed",
    Settle.ABANDON: "failed",
    Settle.DEFER: "deferred",
    Settle.DEAD_LETTER: "dead_lettered",
}
"""The ledger's ``receives.outcome`` for a copy settled by its handler's decision."""


def check_commit(
    keys: Sequence[str], outcome: ClaimState, reasons: Sequence[str] | None
) -> list[str]:
    """The per-key reasons of a commit, after checking its arguments (shared by the stores).

    Raises:
        ConfigurationError: ``outcome`` is not final, or ``reasons`` is not one per key.
    """
    if outcome not in FINAL_STATES:
        raise ConfigurationError(
            f"commit records a final outcome ({', '.join(FINAL_STATES)}), not {outcome!r}"
        )
    if reasons is None:
        return [""] * len(keys)
    if len(reasons) != len(keys):
        raise ConfigurationError(
            f"commit got {len(reasons)} reasons for {len(keys)} keys: give one per key"
        )
    return [str(reason) for reason in reasons]
