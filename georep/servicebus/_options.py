"""The replication options of the drop-in ``ServiceBusClient``: what georep adds to the SDK.

Everything after the client's construction is the SDK's API, so georep's settings are given
once, to ``ServiceBusClient.from_connection_strings(primary, secondary, **options)``, and each
sender and receiver the client hands out takes the ones that concern it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, TypedDict

from georep._policy import DedupKey, DrainPolicy, FailoverPolicy, ReplicationMode, Seconds
from georep.exceptions import ConfigurationError
from georep.ports import Clock, Ledger, Outbox, RoleStore, SeenStore

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["ClientOptions", "checked_options", "receiver_options", "sender_options"]


class ClientOptions(TypedDict, total=False):
    """georep's options of a drop-in ``ServiceBusClient`` (all optional).

    Senders (:class:`georep.GeoSender`'s options): ``mode`` (default passive), ``policy``,
    ``outbox``, ``repair``, ``drain``, ``role_store``. Receivers
    (:class:`georep.GeoReceiver`'s): ``seen`` (required to receive; senders keep the
    mapping of scheduled messages' numbers in it too, when it is a
    :class:`georep.ports.ScheduleStore` such as ``RedisSeenSet``), ``lease``,
    ``max_attempts``, ``on_store_unavailable``, ``owner``, ``poll_interval`` (seconds a
    receive call to an idle region waits, default 1). Both: ``dedup_key``, ``ledger``,
    ``clock``, ``tracer_provider``, ``meter_provider``. ``client_options`` are
    ``azure.servicebus.aio.ServiceBusClient`` settings for both regions
    (``transport_type``, ``http_proxy``, ``connection_verify``...).

    The caller owns ``seen``, ``outbox``, ``ledger`` and ``role_store``: the async client
    never closes them (the sync client closes them with itself, as :mod:`georep.sync` does).
    """

    mode: ReplicationMode | str
    policy: FailoverPolicy
    outbox: Outbox
    repair: bool
    drain: DrainPolicy
    role_store: RoleStore
    seen: SeenStore
    lease: Seconds
    max_attempts: int
    on_store_unavailable: str
    owner: str
    poll_interval: float
    dedup_key: DedupKey
    ledger: Ledger
    clock: Clock
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    client_options: Mapping[str, Any]


_SENDER: Final = (
    "mode",
    "policy",
    "outbox",
    "repair",
    "drain",
    "role_store",
    "dedup_key",
    "ledger",
    "clock",
    "tracer_provider",
    "meter_provider",
)
_RECEIVER: Final = (
    "lease",
    "max_attempts",
    "on_store_unavailable",
    "owner",
    "dedup_key",
    "ledger",
    "tracer_provider",
    "meter_provider",
)
_OTHERS: Final = ("seen", "poll_interval", "client_options", "clock")


def checked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as given, after checking that each is one georep knows.

    Raises:
        ConfigurationError: An unknown option (naming it and the known ones).
    """
    known = {*_SENDER, *_RECEIVER, *_OTHERS}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(
            f"unknown ServiceBusClient option(s) {', '.join(unknown)}: georep's are "
            f"{', '.join(sorted(known))}; settings of azure-servicebus's own client go in "
            "client_options={...}"
        )
    return dict(options)


def sender_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a :class:`georep.GeoSender` takes."""
    return {name: options[name] for name in _SENDER if name in options}


def receiver_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a :class:`georep.GeoReceiver` takes (``seen`` and ``clock`` apart)."""
    return {name: options[name] for name in _RECEIVER if name in options}
