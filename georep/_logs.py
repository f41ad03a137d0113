"""Warnings that repeat while a condition lasts, logged as a state change and a summary.

A region that is down fails every send and every receive; a seen-set that does not answer
fails every claim. Logging each of those at WARNING buried the one line that mattered (186
lines for one outage of a few seconds). :class:`Throttled` logs the first occurrence of a
kind of trouble at its level, then at most one line per ``every`` seconds with the count
of those it held back; each occurrence is still logged at DEBUG, for the detail.
"""

from __future__ import annotations

__all__ = ["SUMMARY_SECONDS", "Throttled"]

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final

SUMMARY_SECONDS: Final = 30.0
"""Seconds between two lines about one kind of trouble, at most (the default)."""
_KINDS: Final = 1024
"""Kinds of trouble remembered per logger; the oldest is forgotten beyond."""


@dataclass(slots=True)
class _Kind:
    logged_at: float
    held_back: int = 0


class Throttled:
    """Log one kind of trouble once, then a line per ``every`` seconds with a count.

    Args:
        logger: Where the lines go.
        every: Seconds between two lines about the same kind (``key``), at least.
        clock: Monotonic seconds (injected in tests).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        every: float = SUMMARY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every = every
        self._clock = clock
        self._kinds: OrderedDict[Hashable, _Kind] = OrderedDict()

    def warning(self, key: Hashable, message: str, *args: object) -> None:
        """:meth:`log` at WARNING."""
        self.log(logging.WARNING, key, message, *args)

    def error(self, key: Hashable, message: str, *args: object) -> None:
        """:meth:`log` at ERROR."""
        self.log(logging.ERROR, key, message, *args)

    def log(self, level: int, key: Hashable, message: str, *args: object) -> None:
        """Log ``message % args`` at ``level`` if ``key`` was not logged in the last
        ``every`` seconds (saying how many were held back since), else at DEBUG."""
        now = self._clock()
        kind = self._kinds.get(key)
        if kind is not None and now - kind.logged_at < self._every:
            kind.held_back += 1
            self._logger.debug(message, *args)
            return
        if kind is not None and kind.held_back:
            message += " (and %d more like it in the last %.0f s)"
            args = (*args, kind.held_back, now - kind.logged_at)
        self._logger.log(level, message, *args)
        self._kinds[key] = _Kind(now)
        self._kinds.move_to_end(key)
        if len(self._kinds) > _KINDS:
            self._kinds.popitem(last=False)

    def ended(self, key: Hashable, message: str, *args: object) -> None:
        """The trouble ``key`` names is over: log ``message`` at INFO if it was logged
        (with how many were held back), and log its next occurrence at once."""
        kind = self._kinds.pop(key, None)
        if kind is None:
            return
        if kind.held_back:
            message += " (%d more like it were held back)"
            args = (*args, kind.held_back)
        self._logger.info(message, *args)
