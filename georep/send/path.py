"""What the passive and active paths of a send share.

The GeoSender's two ways to send (SPEC §2.1-2.3), each over the same region channels.

:class:`PassivePath` sends to the active region and fails over to the backup (swapping the
roles, and probing for switch-back); :class:`ActivePath` sends to both regions at once,
skipping a region that is cooling down. Both queue in the outbox (through ``queue``) what no
region could be reached for.
"""

from __future__ import annotations

__all__ = ["Channel", "Queue", "troubles"]

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry.trace import Span

from georep._channel import RegionChannel
from georep._logs import Throttled
from georep.exceptions import RegionError
from georep.ports import RegionSender
from georep.send.result import SendContext

troubles = Throttled(logging.getLogger("georep.sender"))
"""The paths' warnings that repeat while a region is down: one line, then one per 30 s."""


#: ``queue(messages, regions)``: persist ``messages`` in the outbox for each region label
#: (None: whichever region accepts). Only for messages no region could be reached for.
Queue = Callable[[Sequence[Any], Sequence[str | None]], Awaitable[None]]


Channel = RegionChannel[RegionSender]


def region_failed(span: Span, region: str, error: RegionError) -> None:
    span.add_event(
        "georep.region_failed", {"georep.region": region, "error.type": error.kind.value}
    )


class SendPath:
    """What both paths hold: the shared context and the outbox's ``queue``."""

    def __init__(self, context: SendContext, queue: Queue | None) -> None:
        self._context = context
        self._regions = context.regions
        self._policy = context.policy
        self._counts = context.counts
        self._queue = queue
