"""``georep doctor``'s findings: one line per check, with the fix for each problem."""

from __future__ import annotations

__all__ = ["Finding", "Severity"]

import enum
from dataclasses import dataclass


class Severity(enum.StrEnum):
    """How much a finding matters."""

    OK = "ok"
    """The check passed."""
    WARNING = "warning"
    """georep works, but something may surprise you (the fix says what)."""
    PROBLEM = "problem"
    """georep will not work as intended until this is fixed."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's result.

    Attributes:
        severity: OK, WARNING or PROBLEM.
        subject: What was checked: ``"primary"``, ``"orders"``, ``"redis"``.
        message: What was found; never contains a key or password.
        fix: What to do about it (empty for OK).
    """

    severity: Severity
    subject: str
    message: str
    fix: str = ""

    @classmethod
    def ok(cls, subject: str, message: str) -> Finding:
        return cls(Severity.OK, subject, message)

    @classmethod
    def warning(cls, subject: str, message: str, fix: str) -> Finding:
        return cls(Severity.WARNING, subject, message, fix)

    @classmethod
    def problem(cls, subject: str, message: str, fix: str) -> Finding:
        return cls(Severity.PROBLEM, subject, message, fix)
