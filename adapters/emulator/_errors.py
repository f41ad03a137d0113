"""The error every part of the emulator's broker raises, and the AMQP layers answer with.

It sits below the broker (``_broker``), its sessions (``_sessions``) and the protocol
modules, so that each of them can raise or catch it without importing the others.
"""

from __future__ import annotations

__all__ = ["BrokerError"]


class BrokerError(Exception):
    """An operation the broker refuses; ``condition`` is the AMQP error condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
