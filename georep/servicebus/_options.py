"""The replication options of the drop-in ``ServiceBusClient``: what georep adds to the SDK.

Everything after the client's construction is the SDK's API, so georep's settings are given
once, to ``ServiceBusClient.from_connection_strings(primary, secondary, **options)``, and each
sender and receiver the client hands out takes the ones that concern it.
"""

from __future__ import annotations

__all__ = [
    "ClientConstructors",
    "ClientOptions",
    "ReceiverArguments",
    "SenderArguments",
    "SessionListArguments",
    "checked_options",
    "receiver_options",
    "sender_options",
]

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Self, TypedDict, Unpack

from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

from georep._endpoint import Namespace, Target, endpoint_pair
from georep._policy import DedupKey, DrainPolicy, FailoverPolicy, ReplicationMode, Seconds
from georep.exceptions import ConfigurationError
from georep.ports import Clock, Ledger, Outbox, RoleStore, SeenStore

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider


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
    (``transport_type``, ``http_proxy``, ``connection_verify``...); the SDK client's own
    keyword arguments (``retry_total=``, ``logging_enable=``, ``transport_type=``... as
    ``ServiceBusClient.from_connection_string`` takes them) may be given beside georep's
    instead, as a program written for the SDK passes them, and apply to both regions.

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
    # The SDK client's own keyword arguments (SDK_CLIENT_OPTIONS), for both regions.
    logging_enable: bool
    transport_type: Any
    http_proxy: Mapping[str, Any]
    user_agent: str
    retry_total: int
    retry_backoff_factor: float
    retry_backoff_max: float
    retry_mode: Any
    try_timeout: float
    connection_verify: str
    ssl_context: Any
    uamqp_transport: bool
    socket_timeout: float
    keep_alive: int
    auth_timeout: float


class ClientConstructors:
    """The constructors the sync and async drop-in ``ServiceBusClient`` share: both are
    built from the two namespaces' targets and georep's options."""

    def __init__(self, primary: Target, secondary: Target, **options: Unpack[ClientOptions]):
        raise NotImplementedError

    @classmethod
    def from_connection_strings(
        cls, primary: str, secondary: str, **options: Unpack[ClientOptions]
    ) -> Self:
        """A client on two namespaces, each reached with its connection string.

        Args:
            primary: The primary namespace's connection string.
            secondary: The secondary namespace's connection string.
            **options: georep's options (:class:`ClientOptions`):
                ``mode``, ``seen``, ``outbox``, ``policy``, ``role_store``, ``ledger``...

        Raises:
            ConfigurationError: A malformed connection string (the message names what
                it lacks, never the key), an unknown option or ``mode``.
        """
        return cls(primary, secondary, **options)

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> Self:
        """The SDK's one-namespace constructor: refused, naming the two-region one.

        Raises:
            ConfigurationError: Always (a ``ValueError``): georep's client needs both
                regions' connection strings.
        """
        raise ConfigurationError(
            "georep's ServiceBusClient spans two namespaces: "
            "ServiceBusClient.from_connection_strings(primary_conn, secondary_conn, "
            "seen=RedisSeenSet.from_url(redis_url)) (docs/migration.md)"
        )

    @classmethod
    def from_namespaces(
        cls,
        primary: Namespace,
        secondary: Namespace,
        credential: Any,
        **options: Unpack[ClientOptions],
    ) -> Self:
        """A client on two namespaces reached with ``credential`` (Microsoft Entra ID,
        ``AzureNamedKeyCredential``, ``AzureSasCredential``), as
        :meth:`georep.GeoSender.from_namespaces` takes them (a sync ``TokenCredential`` is
        called on a worker thread).

        Raises:
            ConfigurationError: No namespace or credential, or an unknown option.
        """
        client_options = options.pop("client_options", None)
        first, second = endpoint_pair(primary, secondary, credential, client_options)
        return cls(first, second, **options)


class SenderArguments(TypedDict, total=False):
    """The keyword arguments of ``get_queue_sender`` and ``get_topic_sender``, as the SDK's:
    ``client_identifier`` names the handler; ``socket_timeout``, ``keep_alive``,
    ``auth_timeout`` (and any other keyword the SDK's handlers take) are accepted and logged
    as ignored: give SDK settings in the client's ``client_options`` instead."""

    client_identifier: str | None
    socket_timeout: float | None
    keep_alive: int | None
    auth_timeout: float


class ReceiverArguments(SenderArguments, total=False):
    """The keyword arguments of ``get_queue_receiver`` and ``get_subscription_receiver``, as
    the SDK's (defaults: no session, no sub-queue, ``PEEK_LOCK``, no wait limit, no
    renewer, ``prefetch_count`` 0)."""

    session_id: Any
    sub_queue: ServiceBusSubQueue | str | None
    receive_mode: ServiceBusReceiveMode | str
    max_wait_time: float | None
    auto_lock_renewer: Any
    prefetch_count: int


class SessionListArguments(TypedDict, total=False):
    """The keyword arguments of ``list_queue_sessions`` and ``list_subscription_sessions``,
    as the SDK's: sessions whose state changed after ``state_updated_after`` (default: every
    session with messages or state), within ``timeout`` seconds for the whole list."""

    state_updated_after: datetime | None
    timeout: float | None


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

#: The keyword arguments of ``azure.servicebus.ServiceBusClient`` that a program written for
#: the SDK passes to its constructor: taken beside georep's options, for both regions.
SDK_CLIENT_OPTIONS: Final = frozenset(
    {
        "logging_enable",
        "transport_type",
        "http_proxy",
        "user_agent",
        "retry_total",
        "retry_backoff_factor",
        "retry_backoff_max",
        "retry_mode",
        "try_timeout",
        "connection_verify",
        "ssl_context",
        "uamqp_transport",
        "socket_timeout",
        "keep_alive",
        "auth_timeout",
    }
)


def checked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` after checking that each is one georep or the SDK's client knows, with
    the SDK client's own (``retry_total=``...) moved into ``client_options``.

    Raises:
        ConfigurationError: An unknown option (naming it and the known ones), one SDK
            setting given twice with two values, or ``custom_endpoint_address`` (one
            namespace's address) given for both regions.
    """
    if "custom_endpoint_address" in options:
        raise ConfigurationError(
            "custom_endpoint_address is one namespace's address, and this client spans two: "
            "give each region its own, ServiceBusClient(NamespaceEndpoint(primary_conn, "
            "client_options={'custom_endpoint_address': ...}), NamespaceEndpoint(secondary_conn, "
            "client_options={...}), seen=...) (NamespaceEndpoint from georep.servicebus)"
        )
    known = {*_SENDER, *_RECEIVER, *_OTHERS}
    unknown = sorted(set(options) - known - SDK_CLIENT_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"unknown ServiceBusClient option(s) {', '.join(unknown)}: georep's are "
            f"{', '.join(sorted(known))}, and azure-servicebus's client's are "
            f"{', '.join(sorted(SDK_CLIENT_OPTIONS))} (or any in client_options={{...}})"
        )
    checked = {name: value for name, value in options.items() if name in known}
    sdk = {name: value for name, value in options.items() if name in SDK_CLIENT_OPTIONS}
    if sdk:
        given = dict(checked.get("client_options") or {})
        twice = sorted(n for n in sdk if n in given and given[n] != sdk[n])
        if twice:
            raise ConfigurationError(
                f"{', '.join(twice)} given twice with two values, as a keyword and in "
                "client_options: give each once"
            )
        checked["client_options"] = {**given, **sdk}
    return checked


def sender_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a :class:`georep.GeoSender` takes."""
    return {name: options[name] for name in _SENDER if name in options}


def receiver_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a :class:`georep.GeoReceiver` takes (``seen`` and ``clock`` apart)."""
    return {name: options[name] for name in _RECEIVER if name in options}
