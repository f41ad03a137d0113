"""The backlog queues a PairedSender sends to while failover is engaged (SPEC §3)."""

from __future__ import annotations

__all__ = ["BacklogQueues", "ledger_error"]

import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from opentelemetry import metrics

from georep._channel import RegionChannel
from georep._classify import MESSAGE_FAULT_KINDS
from georep.exceptions import AllRegionsUnavailableError, RegionError
from georep.paired.options import PairedNamespaceOptions
from georep.ports import Clock, RegionAttempt, RegionSender

_log = logging.getLogger("georep.paired")


def ledger_error(error: RegionError) -> str:
    """How the ledger names a failure: the class, ``TimeoutError`` for georep's deadline."""
    cause = error.__cause__
    return type(cause if isinstance(cause, TimeoutError) else error).__name__


class BacklogQueues:
    """Sends to a random backlog queue; one whose send failed leaves the rotation.

    A queue that failed rejoins ``rejoin_after`` seconds later (one slow send must not take
    it away for the rest of an outage), and each send tries every queue at most once.

    Args:
        queues: One sender per backlog queue in the secondary namespace, index order.
        excluded: Queue index → monotonic time it rejoins the rotation; shared by every
            PairedSender on the pair (``PairedState.excluded``).
        entity: The entity the messages are for (each copy names it, SPEC §3).
        rewrite: ``rewrite(message, entity, **extra)`` → the backlog copy of a message.
        rng: Random source for the pick.
        clock: Time source.
        options: The paired namespaces' settings (``ping_primary_interval``: how long a
            failed queue stays out).
        sends: The ``georep.paired.backlog_sends`` counter.
    """

    def __init__(
        self,
        queues: Sequence[RegionSender],
        excluded: dict[int, float],
        *,
        entity: str,
        rewrite: Callable[..., Any],
        rng: random.Random,
        clock: Clock,
        options: PairedNamespaceOptions,
        sends: metrics.Counter,
    ) -> None:
        # The failover timer decides when to fail over: the channels count nothing.
        self._channels = [RegionChannel(queue, clock=clock) for queue in queues]
        self._excluded = excluded
        self._entity = entity
        self._rewrite = rewrite
        self._rng = rng
        self._clock = clock
        self._rejoin_after = options.seconds("ping_primary_interval")
        self._sends = sends

    async def send(
        self,
        messages: list[Any],
        deadline: float,
        attempts: list[RegionAttempt] | None,
        schedule_time_utc: datetime | None = None,
    ) -> str:
        """Send ``messages`` (rewritten, as one batch) to one queue; return its path.

        Each queue tried is appended to ``attempts`` (ledger on).

        Raises:
            RegionError: A queue refused the message for what it is (another would too).
            AllRegionsUnavailableError: No queue in the rotation accepted it.
        """
        extra = {} if schedule_time_utc is None else {"schedule_time_utc": schedule_time_utc}
        # Each message rewritten (its aliases are per message); the copies go as one batch.
        copies = [self._rewrite(message, self._entity, **extra) for message in messages]
        backlog_copy = copies[0] if len(copies) == 1 else copies
        causes: dict[str, BaseException] = {}
        tried: set[int] = set()  # each backlog queue at most once per call
        while True:
            index = self._pick(tried)
            if index is None:
                raise AllRegionsUnavailableError(
                    f"{self._entity} is failed over and no backlog queue accepted the message",
                    causes,
                )
            channel = self._channels[index]
            queue = channel.client
            try:
                await channel.call(deadline, queue.send, backlog_copy)
            except RegionError as exc:
                if exc.kind in MESSAGE_FAULT_KINDS:
                    raise  # the message's fault: another backlog queue would refuse it too
                tried.add(index)
                self._excluded[index] = self._clock.monotonic() + self._rejoin_after
                causes[queue.entity] = exc
                if attempts is not None:
                    attempts.append(RegionAttempt(queue.region, "failed", ledger_error(exc)))
                _log.warning("backlog queue %s left the rotation: %s", queue.entity, exc)
                continue
            self._sends.add(1, {"georep.backlog_queue": str(index)})
            if attempts is not None:
                attempts.append(RegionAttempt(queue.region, "accepted"))
            return queue.entity

    def _pick(self, tried: set[int]) -> int | None:
        """A random queue in the rotation not tried yet; None when there is none."""
        now = self._clock.monotonic()
        candidates = [
            i
            for i in range(len(self._channels))
            if i not in tried and self._excluded.get(i, now) <= now
        ]
        return self._rng.choice(candidates) if candidates else None
