"""What each replication mode costs in billed Service Bus operations (SPEC §7).

The model follows the seeds' own accounting: a message costs one operation to send and one
to receive (each 64 KB of a message is billed as one operation); active replication doubles
that; paired namespaces add a ping per unavailable entity per sender every
``ping_primary_interval`` during an outage, the syphon's long-poll receives on every backlog
queue all month, and four operations for every message that travels through a backlog
queue (send to backlog, receive from backlog, send to primary, receive from primary).
Failed attempts against an unavailable region are not billed and are not counted.
"""

from __future__ import annotations

__all__ = ["BILLING_CHUNK_BYTES", "CostEstimate", "Workload", "estimate_cost", "estimate_costs"]

import dataclasses
import math
from dataclasses import dataclass
from datetime import timedelta

from georep._policy import ReplicationMode, Seconds, count, seconds
from georep.exceptions import ConfigurationError

#: Service Bus bills each 64 KB of a message as one operation.
BILLING_CHUNK_BYTES = 64 * 1024

UNREPLICATED = "unreplicated"
PAIRED = "paired"
#: The modes ``georep cost`` compares, in the order it shows them.
MODES = (UNREPLICATED, ReplicationMode.PASSIVE.value, ReplicationMode.ACTIVE.value, PAIRED)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A month of traffic to price.

    Attributes:
        messages_per_second: Logical messages sent per second, over all entities (≥ 0).
        message_size_bytes: Size of one message; each started 64 KB is one operation.
            Default 1 KB.
        entities: Queues and topics sent to (pinged one by one during an outage). Default 1.
        senders: Sender clients (each pings every unavailable entity). Default 1.
        backlog_queue_count: Paired namespaces: backlog queues. Default 10.
        syphon_hosts: Paired namespaces: processes running the syphon. Default 1.
        outage_minutes_per_month: Expected minutes a month the primary is unavailable.
            Default 0.
        ping_primary_interval: Paired namespaces: seconds (or ``timedelta``) between pings.
            Default 60 s.
        syphon_long_poll: Paired namespaces: the syphon's receive wait. Default 15 min.
        days: Length of the billing period in days. Default 30, as the seed counts.
        price_per_million: Price of one million operations, in your currency.

    Raises:
        ConfigurationError: A value is out of range (the message names it).
    """

    messages_per_second: float
    message_size_bytes: int = 1024
    entities: int = 1
    senders: int = 1
    backlog_queue_count: int = 10
    syphon_hosts: int = 1
    outage_minutes_per_month: float = 0.0
    ping_primary_interval: Seconds = 60.0
    syphon_long_poll: Seconds = timedelta(minutes=15)
    days: float = 30.0
    price_per_million: float = 0.0

    def __post_init__(self) -> None:
        for name in ("messages_per_second", "outage_minutes_per_month", "price_per_million"):
            _finite(getattr(self, name), f"Workload.{name}", allow_zero=True)
        for name in ("message_size_bytes", "entities", "senders", "backlog_queue_count"):
            count(getattr(self, name), f"Workload.{name}")
        count(self.syphon_hosts, "Workload.syphon_hosts", minimum=0)
        _finite(self.days, "Workload.days", allow_zero=False)
        if self.outage_minutes_per_month > self.days * 24 * 60:
            raise ConfigurationError(
                f"Workload.outage_minutes_per_month ({self.outage_minutes_per_month:g}) is "
                f"longer than the period ({self.days:g} days)"
            )
        for name in ("ping_primary_interval", "syphon_long_poll"):
            if seconds(getattr(self, name), f"Workload.{name}") <= 0:
                raise ConfigurationError(f"Workload.{name} must be greater than 0 seconds")

    @property
    def operations_per_message(self) -> int:
        """Billed operations for one send (or one receive) of one message."""
        return math.ceil(self.message_size_bytes / BILLING_CHUNK_BYTES)

    @property
    def messages(self) -> float:
        """Logical messages in the period."""
        return self.messages_per_second * self.days * 86_400

    @property
    def messages_during_outage(self) -> float:
        """Logical messages sent while the primary is unavailable."""
        return self.messages_per_second * self.outage_minutes_per_month * 60


def _finite(value: object, name: str, *, allow_zero: bool) -> float:
    """``value`` as a finite number, >= 0 (``allow_zero``) or > 0.

    Raises:
        ConfigurationError: It is not a number, is NaN, infinite or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "0 or more" if allow_zero else "greater than 0"
        raise ConfigurationError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class CostEstimate:
    """Billed operations of one mode over the workload's period.

    Attributes:
        mode: ``unreplicated``, ``passive``, ``active`` or ``paired``.
        message_operations: Sends and receives of the application's messages (for
            ``paired``, those that went straight to the primary).
        backlog_operations: Paired: four operations per message that went through a
            backlog queue during the outage.
        ping_operations: Paired: pings of unavailable entities.
        syphon_receive_calls: Paired: the syphon's long-poll receives.
        total_operations: The sum.
        amount: ``total_operations`` priced at the workload's price per million.
    """

    mode: str
    message_operations: float
    backlog_operations: float = 0.0
    ping_operations: float = 0.0
    syphon_receive_calls: float = 0.0

    @property
    def total_operations(self) -> float:
        return (
            self.message_operations
            + self.backlog_operations
            + self.ping_operations
            + self.syphon_receive_calls
        )

    def amount(self, price_per_million: float) -> float:
        return self.total_operations / 1_000_000 * price_per_million


def syphon_receive_calls(workload: Workload, period_seconds: float) -> float:
    """Long-poll receives the syphon makes while every entity is available (SPEC §3).

    With 10 backlog queues and a 15-minute long poll: 40 an hour, 960 a day, 28,800 in
    30 days, per syphon host.
    """
    long_poll = seconds(workload.syphon_long_poll, "Workload.syphon_long_poll")
    return workload.backlog_queue_count * period_seconds / long_poll * workload.syphon_hosts


def ping_operations(workload: Workload) -> float:
    """Pings during the outage: one per unavailable entity per sender per interval."""
    interval = seconds(workload.ping_primary_interval, "Workload.ping_primary_interval")
    pings_per_entity = math.floor(workload.outage_minutes_per_month * 60 / interval)
    return float(pings_per_entity * workload.entities * workload.senders)


def estimate_cost(workload: Workload, mode: str) -> CostEstimate:
    """Price ``workload`` in one mode.

    Raises:
        ConfigurationError: ``mode`` is not one of ``unreplicated``, ``passive``,
            ``active``, ``paired``.
    """
    per_message = workload.operations_per_message
    send_and_receive = 2 * per_message
    if mode in (UNREPLICATED, ReplicationMode.PASSIVE.value):
        # Passive sends to one region at a time: fault-free it costs what no replication
        # costs, and during an outage the backup takes the same traffic instead.
        return CostEstimate(mode=mode, message_operations=workload.messages * send_and_receive)
    if mode == ReplicationMode.ACTIVE.value:
        # Two copies sent, and the receiver receives (and settles) both.
        return CostEstimate(mode=mode, message_operations=2 * workload.messages * send_and_receive)
    if mode == PAIRED:
        backlogged = workload.messages_during_outage
        return CostEstimate(
            mode=mode,
            message_operations=(workload.messages - backlogged) * send_and_receive,
            backlog_operations=backlogged * 4 * per_message,
            ping_operations=ping_operations(workload),
            syphon_receive_calls=syphon_receive_calls(workload, workload.days * 86_400),
        )
    raise ConfigurationError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")


def estimate_costs(workload: Workload, modes: tuple[str, ...] = MODES) -> list[CostEstimate]:
    """Price ``workload`` in each of ``modes`` (default: all four), side by side.

    Raises:
        ConfigurationError: A mode is unknown, or the workload's totals overflow (a rate
            of 1e308 messages a second is finite; its month is not).
    """
    estimates = [estimate_cost(workload, mode) for mode in modes]
    for estimate in estimates:
        numbers = [v for v in dataclasses.astuple(estimate) if isinstance(v, float | int)]
        if not all(math.isfinite(v) for v in numbers):
            raise ConfigurationError(
                f"the workload is too large to count ({workload.messages_per_second:g} "
                f"messages a second for {workload.days:g} days overflows): lower "
                "messages_per_second or days"
            )
    return estimates
