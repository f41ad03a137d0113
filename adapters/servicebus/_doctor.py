"""``georep doctor``'s Service Bus checks: both namespaces reachable, keys accepted, and every
entity present in both with the settings that replication depends on."""

from __future__ import annotations

__all__ = ["QUEUE_SETTINGS", "SUBSCRIPTION_SETTINGS", "TOPIC_SETTINGS", "check_namespaces"]

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
)
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.aio.management import ServiceBusAdministrationClient

from georep._doctor import Finding
from georep._endpoint import check_connection_string
from georep._lifecycle import wait_within
from georep.exceptions import ConfigurationError
from georep.paired.options import backlog_queue_path
from georep.ports import ErrorKind

from ._errors import translate_error
from ._sender import namespace_of

#: Settings that must match between the two regions, per entity kind: a receiver written for
#: one region's lock duration, delivery count or sessions misbehaves in the other, and a
#: sender's partitioning and duplicate-detection assumptions must hold in both.
QUEUE_SETTINGS = (
    "lock_duration",
    "max_delivery_count",
    "requires_duplicate_detection",
    "enable_partitioning",
    "requires_session",
)
TOPIC_SETTINGS = ("requires_duplicate_detection", "enable_partitioning")
SUBSCRIPTION_SETTINGS = ("lock_duration", "max_delivery_count", "requires_session")

_BACKLOG_MARK = backlog_queue_path("x", 0).split("/")[1]  # "x-servicebus-transfer"
_NETWORK_FIX = (
    "check the Endpoint, DNS and firewall rules (AMQP needs port 5671 open to the namespace)"
)
_REFUSED = "the management endpoint refused the key (a wrong key, or one without Manage rights)"
_MANAGE_FIX = (
    "run doctor with a key that has Manage rights (e.g. RootManageSharedAccessKey) to compare "
    "entity settings"
)
_CERTIFICATE_FIX = (
    "give the CA bundle that signed the endpoint's certificate: georep doctor --ca-file PATH "
    "(or $GEOREP_CA_FILE); for the local emulator, its CA file (printed by `georep "
    "emulator`, Emulator.ca_file)"
)


def _certificate_error(error: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind ``error`` (azure-core wraps aiohttp's
    wrapping of ssl's), or None when it is another failure."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        # aiohttp's ClientConnectorCertificateError is one too; the ssl error it holds
        # says why (verify_message).
        inner = getattr(current, "certificate_error", None)
        if isinstance(current, ssl.SSLCertVerificationError) and not isinstance(
            inner, ssl.SSLCertVerificationError
        ):
            return current
        pending += [
            current.__cause__,
            current.__context__,
            getattr(current, "inner_exception", None),
            inner,
        ]
    return None


@dataclass
class _Inventory:
    """What one namespace's admin endpoint says it holds."""

    queues: dict[str, Any] = field(default_factory=dict)
    topics: dict[str, Any] = field(default_factory=dict)
    subscriptions: dict[str, Any] = field(default_factory=dict)  # "topic/sub" -> properties
    readable: bool = True


async def _inventory(
    region: str,
    connection_string: str,
    connection_verify: str | None,
    timeout: float,
    findings: list[Finding],
) -> _Inventory | None:
    """Read every queue, topic and subscription; None if the namespace is unreachable."""
    inventory = _Inventory()
    # No retry of a failed connection: the SDK's backoff would turn a refused certificate
    # or an unknown host into a timeout that names neither.
    kwargs: dict[str, Any] = {"retry_connect": 0}
    if connection_verify is not None:
        kwargs["connection_verify"] = connection_verify
    admin = ServiceBusAdministrationClient.from_connection_string(connection_string, **kwargs)
    try:
        async with admin:

            async def read() -> None:
                async for queue in admin.list_queues():
                    if _BACKLOG_MARK not in queue.name:
                        inventory.queues[queue.name] = queue
                async for topic in admin.list_topics():
                    inventory.topics[topic.name] = topic
                    async for subscription in admin.list_subscriptions(topic.name):
                        inventory.subscriptions[f"{topic.name}/{subscription.name}"] = subscription

            await wait_within(read(), timeout)
    except ClientAuthenticationError:
        inventory.readable = False
        findings.append(Finding.warning(region, _REFUSED, _MANAGE_FIX))
    except HttpResponseError as exc:
        if exc.status_code in (401, 403):
            inventory.readable = False
            findings.append(Finding.warning(region, _REFUSED, _MANAGE_FIX))
        else:
            findings.append(
                Finding.problem(
                    region,
                    f"the management endpoint answered HTTP {exc.status_code}",
                    "check the namespace in the Azure portal; retry later if it is throttled",
                )
            )
            return None
    except (ServiceRequestError, OSError, TimeoutError) as exc:
        certificate = _certificate_error(exc)
        if certificate is not None:
            reason = getattr(certificate, "verify_message", None) or "not trusted"
            findings.append(
                Finding.problem(
                    region,
                    f"{namespace_of(connection_string)}: certificate verification error on "
                    f"the management endpoint ({reason}"
                    + ("" if connection_verify is None else f", CA file {connection_verify}")
                    + "), not a network problem",
                    _CERTIFICATE_FIX,
                )
            )
            return None
        findings.append(
            Finding.problem(
                region,
                f"{namespace_of(connection_string)} cannot be reached ({type(exc).__name__})",
                "check the Endpoint in the connection string, DNS, firewall rules and that "
                "the namespace exists",
            )
        )
        return None
    return inventory


def _compare(
    kind: str,
    inventories: Mapping[str, _Inventory],
    names_of: Callable[[_Inventory], dict[str, Any]],
    settings: Sequence[str],
    findings: list[Finding],
) -> list[str]:
    """Findings for entities of one kind; return the names present in both regions."""
    primary, secondary = inventories["primary"], inventories["secondary"]
    both: list[str] = []
    for name in sorted(set(names_of(primary)) | set(names_of(secondary))):
        missing = [region for region, inv in inventories.items() if name not in names_of(inv)]
        if missing:
            present = "primary" if missing == ["secondary"] else "secondary"
            findings.append(
                Finding.problem(
                    name,
                    f"{kind} exists only in the {present}",
                    f"create the {kind} '{name}' in the {missing[0]} namespace with the same "
                    "settings",
                )
            )
            continue
        both.append(name)
        ours, theirs = names_of(primary)[name], names_of(secondary)[name]
        differences = [
            f"{setting} {getattr(ours, setting)!s} vs {getattr(theirs, setting)!s}"
            for setting in settings
            if getattr(ours, setting, None) != getattr(theirs, setting, None)
        ]
        if differences:
            findings.append(
                Finding.problem(
                    name,
                    f"{kind} settings differ (primary vs secondary): {'; '.join(differences)}",
                    "make both regions' settings equal (partitioning and sessions are set at "
                    "creation only: recreate the entity)",
                )
            )
        else:
            findings.append(Finding.ok(name, f"{kind} present in both, settings match"))
    return both


async def _probe(
    region: str,
    connection_string: str,
    queues: Sequence[str],
    topics: Sequence[str],
    timeout: float,
    findings: list[Finding],
    session_queues: frozenset[str] = frozenset(),
    named: bool = False,
) -> None:
    """Open real AMQP links: Send on every entity, Listen (a peek) on every queue.

    Session queues get no peek: a receiver there needs a session id. ``named``: the
    entities were named by the caller (``--entity``), not found by listing.
    """
    namespace = namespace_of(connection_string)
    if not queues and not topics:
        if named:
            message = (
                f"{namespace}: none of the entities named with --entity is a queue or topic "
                "present in both namespaces, so the key was not tried"
            )
            fix = "create them in both namespaces (see above), or name ones that exist"
        else:
            message = f"{namespace}: no queue or topic found, so the key was not tried"
            fix = "create the queues and topics, or name them with --entity"
        findings.append(Finding.warning(region, message, fix))
        return
    client = ServiceBusClient.from_connection_string(connection_string, retry_total=0)

    async def bounded(handler: Any, call: Callable[[], Awaitable[object]]) -> None:
        """Open ``handler``'s link, make ``call``, close it: each step within --timeout
        (opening and closing were unbounded, and a namespace answering slowly took
        minutes with --timeout 1)."""
        await wait_within(handler.__aenter__(), timeout)
        try:
            await wait_within(call(), timeout)
        finally:
            with contextlib.suppress(Exception):
                await wait_within(handler.close(), timeout)

    try:
        for name, is_queue in [(q, True) for q in queues] + [(t, False) for t in topics]:
            try:
                sender = (
                    client.get_queue_sender(name) if is_queue else client.get_topic_sender(name)
                )
                await bounded(sender, sender.create_message_batch)
                if is_queue and name not in session_queues:
                    receiver = client.get_queue_receiver(name)
                    await bounded(receiver, partial(receiver.peek_messages, max_message_count=1))
            except Exception as exc:
                error = translate_error(exc, region=region, namespace=namespace)
                if error is None:
                    raise
                kind = error.kind
                fix = {
                    ErrorKind.AUTHENTICATION: "use a key with Send and Listen rights on this "
                    "namespace (SharedAccessKeyName / SharedAccessKey)",
                    ErrorKind.ENTITY_NOT_FOUND: f"create '{name}' in the {region} namespace",
                    ErrorKind.ENTITY_DISABLED: f"enable '{name}' in the {region} namespace",
                    ErrorKind.CONNECTION: _NETWORK_FIX,
                    ErrorKind.TIMEOUT: _NETWORK_FIX,
                }.get(kind, "see the service's message above")
                findings.append(Finding.problem(region, f"{name}: {error}", fix))
                if kind in (ErrorKind.CONNECTION, ErrorKind.TIMEOUT, ErrorKind.AUTHENTICATION):
                    return  # every other entity would say the same
        findings.append(
            Finding.ok(region, f"{namespace}: reachable, key accepted for send and receive")
        )
    finally:
        with contextlib.suppress(Exception):  # what it found is said already
            await wait_within(client.close(), timeout)


async def check_namespaces(
    primary: str,
    secondary: str,
    *,
    entities: Sequence[str] = (),
    connection_verify: str | None = None,
    timeout: float = 10.0,
) -> list[Finding]:
    """Check both namespaces of a pair.

    Args:
        primary: The primary namespace's connection string.
        secondary: The secondary namespace's connection string.
        entities: Queues and topics to check; default every one either namespace holds
            (backlog queues excepted: they live in the secondary only, by design).
        connection_verify: CA bundle for the management endpoint (the emulator's
            ``ca_file``); default the system's.
        timeout: Seconds each network step may take.

    Returns:
        One finding per check, problems with their fix. Nothing raised for what is found.
    """
    findings: list[Finding] = []
    strings = {"primary": primary, "secondary": secondary}
    for region, connection_string in strings.items():
        try:
            check_connection_string(connection_string, region)
        except ConfigurationError as exc:
            findings.append(Finding.problem(region, str(exc), "fix the connection string"))
    if findings:
        return findings
    if namespace_of(primary) == namespace_of(secondary):
        findings.append(
            Finding.problem(
                "pair",
                "both connection strings point at the same namespace",
                "give the secondary namespace, in another region",
            )
        )
    inventories: dict[str, _Inventory] = {}
    for region, connection_string in strings.items():
        inventory = await _inventory(
            region, connection_string, connection_verify, timeout, findings
        )
        if inventory is not None:
            inventories[region] = inventory
    queues = [e for e in entities if "/" not in e]
    topics: list[str] = []
    if len(inventories) == 2 and all(inv.readable for inv in inventories.values()):
        wanted = set(entities)

        def only(names: dict[str, Any]) -> dict[str, Any]:
            if not wanted:
                return names
            return {n: v for n, v in names.items() if n in wanted or n.split("/")[0] in wanted}

        queues = _compare("queue", inventories, lambda i: only(i.queues), QUEUE_SETTINGS, findings)
        topics = _compare("topic", inventories, lambda i: only(i.topics), TOPIC_SETTINGS, findings)
        _compare(
            "subscription",
            inventories,
            lambda i: only(i.subscriptions),
            SUBSCRIPTION_SETTINGS,
            findings,
        )
        held = {name for inv in inventories.values() for name in (*inv.queues, *inv.topics)}
        for name in sorted(wanted - held):
            findings.append(
                Finding.problem(
                    name,
                    "no queue or topic of this name in either namespace",
                    f"create '{name}' in both namespaces, or check the name",
                )
            )
    elif not entities:
        # Settings cannot be compared: probe whatever either readable namespace holds.
        queues = sorted({name for inv in inventories.values() for name in inv.queues})
        topics = sorted({name for inv in inventories.values() for name in inv.topics})
    session_queues = frozenset(
        name
        for inventory in inventories.values()
        for name, queue in inventory.queues.items()
        if getattr(queue, "requires_session", False)
    )
    # Both regions at once (each link costs a round of opening and closing), their
    # findings kept in region order.
    probed: dict[str, list[Finding]] = {region: [] for region in inventories}
    await asyncio.gather(
        *(
            _probe(
                region,
                strings[region],
                queues,
                topics,
                timeout,
                probed[region],
                session_queues,
                named=bool(entities),
            )
            for region in inventories
        )
    )
    for region_findings in probed.values():
        findings += region_findings
    return findings
