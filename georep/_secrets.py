"""Secrets kept out of georep's text: its errors' messages and its log lines.

georep builds its messages from namespaces and entity names, never from a connection
string; this is the second line of defence, for text it does not write itself: an SDK
error's message, or an application handler's exception logged when it failed.
"""

from __future__ import annotations

__all__ = ["LOGGERS", "SecretMask", "mask_log_secrets", "mask_secrets"]

import logging
import re
from typing import Final

# A secret's value after its name: connection-string keys, a SAS token's signature, the
# relay's token parameter. "..." and "<...>" are placeholders in hints, left as they are.
_SECRET = re.compile(
    r"(?i)\b(SharedAccessKey|SharedAccessSignature|AccountKey|sig|sb-hc-token)"
    r"(=|%3D)(?!\.\.\.|<)([^;&\s'\"]+)"
)

_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)")

LOGGERS: Final = (
    "georep",
    "georep.adapters.servicebus",
    "georep.audit",
    "georep.cli",
    "georep.emulator",
    "georep.emulator.amqp",
    "georep.emulator.relay",
    "georep.ledger",
    "georep.outbox",
    "georep.paired",
    "georep.receiver",
    "georep.relay",
    "georep.roles",
    "georep.scenario",
    "georep.sender",
    "georep.servicebus",
    "georep.soak",
    "georep.soak.nemesis",
    "georep.soak.worker",
    "georep.spark",
    "georep.sync",
    "georep.syphon",
)
"""Every logger georep logs on (a filter on a logger does not reach its children's
records, so each has its own; tests/unit/test_secret_logs.py checks the list is whole)."""


def mask_secrets(text: str) -> str:
    """``text`` with the value of every key, SAS signature or token in it, and the password
    of every URL (``redis://:pw@host``, ``postgres://user:pw@host``), replaced by ``***``.

    Every georep error's text goes through it, and every line georep logs (:class:`SecretMask`),
    a handler's exception included.
    """
    return _URL_PASSWORD.sub(r"\1***\3", _SECRET.sub(r"\1\2***", text))


class SecretMask(logging.Filter):
    """Mask secrets in a record's message and its traceback before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the format
            return True  # left to the handler, which reports it (logging's own way)
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_text is None:
            # What a formatter would print, masked (formatters use exc_text when it is set).
            record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info))
        return True


_MASK: Final = SecretMask()


def mask_log_secrets() -> None:
    """Put :class:`SecretMask` on every georep logger (once each; ``import georep`` does)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _MASK not in logger.filters:
            logger.addFilter(_MASK)
