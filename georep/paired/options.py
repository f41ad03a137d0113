"""Paired namespaces (SPEC §3): options, backlog queue paths and the backlog aliases.

Faithful to the old .NET ``SendAvailabilityPairedNamespaceOptions``: while the primary is
unavailable, messages go to backlog queues in the secondary namespace, rewritten so that
one backlog queue can carry messages for many entities; a syphon moves them back.
"""

from __future__ import annotations

__all__ = [
    "BACKLOG_ALIASES",
    "BACKLOG_QUEUE_PROPERTIES",
    "PairedNamespaceOptions",
    "backlog_queue_path",
]

import re
from dataclasses import dataclass
from datetime import timedelta

from georep._policy import Seconds, as_seconds, count, flag, seconds
from georep.exceptions import ConfigurationError

#: Application properties a message carries in a backlog queue (SPEC §3). The seed's table
#: prints ``x-ms-path`` for ScheduledEnqueueTimeUtc; that is a known doc error.
BACKLOG_ALIASES = {
    "session_id": "x-ms-sessionid",
    "time_to_live": "x-ms-timetolive",
    "scheduled_enqueue_time_utc": "x-ms-scheduledenqueuetimeutc",
    "destination": "x-ms-path",
}

_MAX_DURATION = timedelta(days=10675199)  # the service's "TimeSpan.MaxValue" in practice

#: How a backlog queue is created when absent (SPEC §3), as QueueProperties keywords.
BACKLOG_QUEUE_PROPERTIES: dict[str, object] = {
    "max_size_in_megabytes": 5120,
    "max_delivery_count": 2**31 - 1,
    "default_message_time_to_live": _MAX_DURATION,
    "auto_delete_on_idle": _MAX_DURATION,
    "lock_duration": timedelta(minutes=1),
    "dead_lettering_on_message_expiration": True,
    "enable_batched_operations": True,
}


def _bounded(value: Seconds, name: str, low: float, high: float) -> float:
    result = seconds(value, f"PairedNamespaceOptions.{name}")
    if not low <= result <= high:
        raise ConfigurationError(
            f"PairedNamespaceOptions.{name} must be between {low:g} s and {high:g} s, "
            f"got {result:g} s"
        )
    return result


@dataclass(frozen=True, kw_only=True)
class PairedNamespaceOptions:
    """How the paired-namespace send mode behaves. Times are seconds or ``timedelta``.

    Attributes:
        backlog_queue_count: Backlog queues in the secondary namespace (at least 1).
            Default 10.
        failover_interval: How long non-transient send failures must last, with no
            successful send, before failover engages for an entity: 0-60 min; 0 fails over
            on the first failure. Default 60 s.
        ping_primary_interval: Seconds between pings of an unavailable entity: 1 s-30 min.
            Default 60 s.
        ping_timeout: Deadline of one ping. Default 120 s.
        failback_after: How long the primary must answer every ping before failover
            disengages: 0-24 h. Default 0: the first successful ping disengages it (the
            .NET client's behaviour, SPEC §3); with a fleet sharing roles, a longer time
            keeps a flapping primary from pulling every process back and forth.
        enable_syphon: This process hosts the syphon. Default False.
        syphon_retry_interval: The syphon's wait before retrying a primary that refused:
            1 s-2 min. Default 1 s.
        syphon_long_poll: The syphon's receive wait per backlog queue. Default 15 min.
        syphon_batch_size: Messages per syphon receive. Default 100.
        syphon_prefetch: The syphon receivers' prefetch. Default 100.
        partner_close_timeout: When one side's client faults or closes, the syphon closes
            the other after this long. Default 5 s.

    Raises:
        ConfigurationError: A value is out of its range, NaN or infinite, a count is not an
            ``int``, or a flag not a ``bool`` (the message names the field).
    """

    backlog_queue_count: int = 10
    failover_interval: Seconds = 60.0
    ping_primary_interval: Seconds = 60.0
    ping_timeout: Seconds = 120.0
    failback_after: Seconds = 0.0
    enable_syphon: bool = False
    syphon_retry_interval: Seconds = 1.0
    syphon_long_poll: Seconds = 900.0
    syphon_batch_size: int = 100
    syphon_prefetch: int = 100
    partner_close_timeout: Seconds = 5.0

    def seconds(self, name: str) -> float:
        """One of the durations, in seconds."""
        value: Seconds = getattr(self, name)
        return as_seconds(value)

    def __post_init__(self) -> None:
        for name in ("backlog_queue_count", "syphon_batch_size", "syphon_prefetch"):
            count(getattr(self, name), f"PairedNamespaceOptions.{name}")
        flag(self.enable_syphon, "PairedNamespaceOptions.enable_syphon")
        for name, low, high in (
            ("failover_interval", 0.0, 3600.0),
            ("ping_primary_interval", 1.0, 1800.0),
            ("syphon_retry_interval", 1.0, 120.0),
            ("ping_timeout", 0.001, float("inf")),
            ("failback_after", 0.0, 86400.0),
            ("syphon_long_poll", 0.001, float("inf")),
            ("partner_close_timeout", 0.0, float("inf")),
        ):
            object.__setattr__(self, name, _bounded(getattr(self, name), name, low, high))


_NAME = re.compile(r"[^A-Za-z0-9-]")


def backlog_queue_path(primary_namespace: str, index: int) -> str:
    """``{primary namespace name}/x-servicebus-transfer/{index}`` (SPEC §3).

    ``primary_namespace`` may be the name (``contoso-east``) or the fully qualified
    namespace (``contoso-east.servicebus.windows.net``): its first label is used. A local
    ``host:port`` (the emulator) becomes ``host-port`` with dots replaced, so the path stays
    a valid entity name.
    """
    if index < 0:
        raise ConfigurationError("a backlog queue index is >= 0")
    host = primary_namespace.strip().rstrip("/")
    host = host.split("://", 1)[-1]
    if re.fullmatch(r"[\d.]+(:\d+)?", host) or host.startswith("localhost"):
        name = _NAME.sub("-", host)
    else:
        name = host.split(".", 1)[0]
    if not name:
        raise ConfigurationError(f"cannot make a namespace name of {primary_namespace!r}")
    return f"{name}/x-servicebus-transfer/{index}"
