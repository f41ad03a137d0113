"""The faults injected into one emulated namespace, and what each rejection looks like.

Below the server (``_server``), the protocol modules that obey the faults (``_amqp``,
``_relay``) and the control endpoint that sets them (``_control``).
"""

from __future__ import annotations

__all__ = ["SEND_REJECT_CONDITIONS", "Faults"]

from dataclasses import dataclass
from typing import Any

#: ``reject-sends`` condition -> (AMQP error condition, description) a send is rejected with.
SEND_REJECT_CONDITIONS = {
    "server-busy": (
        "com.microsoft:server-busy",
        "The server is busy. Retry the operation later (injected fault).",
    ),
    "timeout": (
        "com.microsoft:timeout",
        "The operation did not complete in time (injected fault).",
    ),
    "internal-error": (
        "amqp:internal-error",
        "The service had an internal error (injected fault).",
    ),
    "quota-exceeded": ("amqp:resource-limit-exceeded", "The entity is full (injected fault)."),
}


@dataclass
class Faults:
    """Faults injected into one namespace. All off by default."""

    down: bool = False
    paused: bool = False
    latency: float = 0.0
    reject_sends: str | None = None
    dropped_dispositions: int = 0
    lost_settlements: int = 0

    def reject_condition(self) -> tuple[str, str]:
        assert self.reject_sends is not None
        return SEND_REJECT_CONDITIONS[self.reject_sends]

    def take_dropped_disposition(self) -> bool:
        return self._spend("dropped_dispositions")

    def take_lost_settlement(self) -> bool:
        return self._spend("lost_settlements")

    def _spend(self, counter: str) -> bool:
        """Count one off a counted fault; False when none is left."""
        left: int = getattr(self, counter)
        if left > 0:
            setattr(self, counter, left - 1)
            return True
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "down": self.down,
            "blackhole": self.paused,
            "latency": self.latency,
            "reject_sends": self.reject_sends,
            "dropped_dispositions": self.dropped_dispositions,
            "lost_settlements": self.lost_settlements,
        }
