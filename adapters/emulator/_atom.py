"""Atom XML of the Service Bus management REST API, as pure functions (no I/O).

The SDK's ``ServiceBusAdministrationClient`` PUTs an Atom ``<entry>`` whose ``<content>`` holds a
``QueueDescription``, ``TopicDescription`` or ``SubscriptionDescription`` in the
``.../2010/10/servicebus/connect`` namespace, and reads back entries and feeds of the same shape.
This module converts between that XML and plain dicts keyed by the SDK's snake_case property
names: the settable ones of ``QueueProperties`` / ``TopicProperties`` / ``SubscriptionProperties``
(``lock_duration``, ``max_delivery_count``, ...) and the read-only ones of their ``*Runtime
Properties`` counterparts (``total_message_count``, ``active_message_count``, ``size_in_bytes``,
``created_at_utc``, ``subscription_count``, ...) plus ``availability_status``.

Durations are :class:`~datetime.timedelta`, timestamps are aware UTC
:class:`~datetime.datetime`. The service's "infinite" duration, .NET ``TimeSpan.MaxValue``
(``P10675199DT2H48M5.4775807S``), is :data:`TIMESPAN_MAX`.
"""

from __future__ import annotations

__all__ = [
    "TIMESPAN_MAX",
    "TIMESPAN_MAX_TEXT",
    "AtomContext",
    "AtomError",
    "default_properties",
    "format_duration",
    "parse_description",
    "parse_duration",
    "parse_rule",
    "render_empty_feed",
    "render_entity_feed",
    "render_entry",
    "render_error",
    "render_namespace_entry",
    "render_rule_entry",
    "render_rule_feed",
]

import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal
from enum import Enum
from typing import Any, Final
from urllib.parse import quote

from ._rules import CORRELATION_FIELDS, Rule, RuleAction, RuleFilter

_ATOM_NS: Final = "http://www.w3.org/2005/Atom"
_SB_NS: Final = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
_COUNTS_NS: Final = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
_XSI_TYPE: Final = "{http://www.w3.org/2001/XMLSchema-instance}type"

# .NET TimeSpan.MaxValue truncated to whole microseconds.
TIMESPAN_MAX: Final = timedelta(days=10675199, hours=2, minutes=48, seconds=5, microseconds=477580)
TIMESPAN_MAX_TEXT: Final = "P10675199DT2H48M5.4775807S"
# The SDK reads MaxValue as ...477581 µs and, before an update, subtracts 1 µs in float seconds,
# which at this magnitude lands some 40 µs lower. Anything this close to MaxValue means "never".
_NEAR_MAX: Final = TIMESPAN_MAX - timedelta(seconds=1)

_DURATION_RE = re.compile(
    r"(?P<sign>-)?P(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)
_US_PER: Final = {"days": 86_400_000_000, "hours": 3_600_000_000, "minutes": 60_000_000}


class AtomError(ValueError):
    """A request body is not a description this emulator understands; the message says why."""


def parse_duration(text: str) -> timedelta:
    """Parse an ISO-8601 duration as the service writes them (days, hours, minutes, seconds).

    Values within a second of ``TimeSpan.MaxValue``, or above it, clamp to :data:`TIMESPAN_MAX`
    so that "never" stays one well-known value however the client spelled or rounded it.

    Args:
        text: For example ``PT1M``, ``P1DT2H``, ``PT0.5S`` or ``P10675199DT2H48M5.4775807S``.

    Returns:
        The duration, truncated to whole microseconds.

    Raises:
        ValueError: ``text`` is not such a duration (years, months and weeks are not accepted,
            as ``TimeSpan`` has no fixed length for them).
    """
    text = text.strip()
    match = _DURATION_RE.fullmatch(text)
    parts = match.groupdict() if match else {}
    has_time = parts.get("hours") or parts.get("minutes") or parts.get("seconds")
    if not match or not (parts["days"] or has_time) or ("T" in text and not has_time):
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    micros = sum(int(parts[unit]) * factor for unit, factor in _US_PER.items() if parts[unit])
    if parts["seconds"]:
        micros += int((Decimal(parts["seconds"]) * 1_000_000).to_integral_value(ROUND_FLOOR))
    if micros >= _NEAR_MAX // timedelta(microseconds=1):
        return -TIMESPAN_MAX if parts["sign"] else TIMESPAN_MAX
    return timedelta(microseconds=-micros if parts["sign"] else micros)


def format_duration(value: timedelta) -> str:
    """Format a duration the way the service does, e.g. ``PT1M`` or ``P2DT0.5S``.

    Args:
        value: The duration; within a second of :data:`TIMESPAN_MAX` or more, it is written as
            ``TimeSpan.MaxValue``.

    Returns:
        The ISO-8601 text.
    """
    if value >= _NEAR_MAX:
        return TIMESPAN_MAX_TEXT
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if value.microseconds:
        clock += f"{seconds}.{value.microseconds:06d}".rstrip("0") + "S"
    elif seconds:
        clock += f"{seconds}S"
    days = f"{value.days}D" if value.days else ""
    if not clock and not days:
        clock = "0S"
    return f"{sign}P{days}" + (f"T{clock}" if clock else "")


def _format_datetime(value: datetime) -> str:
    # Naive datetimes are taken as UTC: the backend stores UTC and the wire format requires "Z".
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _format_str(value: Any) -> str:
    # str() of a str-Enum such as the SDK's EntityStatus gives "EntityStatus.ACTIVE", not "Active".
    return str(value.value if isinstance(value, Enum) else value)


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false", "1", "0"):
        raise ValueError(f"not a boolean: {text!r}")
    return lowered in ("true", "1")


def _parse_str(text: str) -> str | None:
    # An empty <ForwardTo/> means "no forwarding", the same as leaving the element out.
    return text or None


_PARSE: Final[dict[str, Callable[[str], Any]]] = {
    "duration": parse_duration,
    "int": lambda text: int(text.strip()),
    "bool": _parse_bool,
    "str": _parse_str,
}
_FORMAT: Final[dict[str, Callable[[Any], str]]] = {
    "duration": format_duration,
    "int": lambda value: str(int(value)),
    "bool": lambda value: "true" if value else "false",
    "str": _format_str,
    "datetime": _format_datetime,
}


@dataclass(frozen=True)
class _Field:
    """One child of a ``*Description`` element, in the service's element order."""

    tag: str
    key: str
    kind: str  # a key of _FORMAT, or "counts" for the CountDetails block
    writable: bool = True  # read-only fields are rendered but ignored when a client sends them


def _runtime(tag: str, key: str, kind: str) -> _Field:
    return _Field(tag, key, kind, writable=False)


# Every child element any description carries, once; each entity lists its own in order below.
_CATALOGUE: Final[dict[str, _Field]] = {
    field.tag: field
    for field in (
        _Field("LockDuration", "lock_duration", "duration"),
        _Field("MaxSizeInMegabytes", "max_size_in_megabytes", "int"),
        _Field("RequiresDuplicateDetection", "requires_duplicate_detection", "bool"),
        _Field("RequiresSession", "requires_session", "bool"),
        _Field("DefaultMessageTimeToLive", "default_message_time_to_live", "duration"),
        _Field("DeadLetteringOnMessageExpiration", "dead_lettering_on_message_expiration", "bool"),
        _Field(
            "DeadLetteringOnFilterEvaluationExceptions",
            "dead_lettering_on_filter_evaluation_exceptions",
            "bool",
        ),
        _Field(
            "DuplicateDetectionHistoryTimeWindow",
            "duplicate_detection_history_time_window",
            "duration",
        ),
        _Field("MaxDeliveryCount", "max_delivery_count", "int"),
        _Field("EnableBatchedOperations", "enable_batched_operations", "bool"),
        _Field("FilteringMessagesBeforePublishing", "filtering_messages_before_publishing", "bool"),
        _Field("SupportOrdering", "support_ordering", "bool"),
        _Field("Status", "status", "str"),
        _Field("AutoDeleteOnIdle", "auto_delete_on_idle", "duration"),
        _Field("EnablePartitioning", "enable_partitioning", "bool"),
        _Field("EnableExpress", "enable_express", "bool"),
        _Field("ForwardTo", "forward_to", "str"),
        _Field("ForwardDeadLetteredMessagesTo", "forward_dead_lettered_messages_to", "str"),
        _Field("UserMetadata", "user_metadata", "str"),
        _Field("MaxMessageSizeInKilobytes", "max_message_size_in_kilobytes", "int"),
        _runtime("SizeInBytes", "size_in_bytes", "int"),
        _runtime("MessageCount", "total_message_count", "int"),
        _runtime("CreatedAt", "created_at_utc", "datetime"),
        _runtime("UpdatedAt", "updated_at_utc", "datetime"),
        _runtime("AccessedAt", "accessed_at_utc", "datetime"),
        _runtime("CountDetails", "", "counts"),
        _runtime("SubscriptionCount", "subscription_count", "int"),
        _runtime("SqlFilterCount", "sql_filter_count", "int"),
        _runtime("CorrelationFilterCount", "correlation_filter_count", "int"),
        _runtime("EntityAvailabilityStatus", "availability_status", "str"),
    )
}


def _fields(*tags: str) -> tuple[_Field, ...]:
    return tuple(_CATALOGUE[tag] for tag in tags)


# Element order matters to the real service, so it follows the SDK's MODEL_CLASS_ATTRIBUTES.
_QUEUE_FIELDS: Final = _fields(
    "LockDuration",
    "MaxSizeInMegabytes",
    "RequiresDuplicateDetection",
    "RequiresSession",
    "DefaultMessageTimeToLive",
    "DeadLetteringOnMessageExpiration",
    "DuplicateDetectionHistoryTimeWindow",
    "MaxDeliveryCount",
    "EnableBatchedOperations",
    "SizeInBytes",
    "MessageCount",
    "Status",
    "CreatedAt",
    "UpdatedAt",
    "AccessedAt",
    "CountDetails",
    "AutoDeleteOnIdle",
    "EnablePartitioning",
    "EntityAvailabilityStatus",
    "EnableExpress",
    "ForwardTo",
    "UserMetadata",
    "ForwardDeadLetteredMessagesTo",
    "MaxMessageSizeInKilobytes",
)
_TOPIC_FIELDS: Final = _fields(
    "DefaultMessageTimeToLive",
    "MaxSizeInMegabytes",
    "RequiresDuplicateDetection",
    "DuplicateDetectionHistoryTimeWindow",
    "EnableBatchedOperations",
    "SizeInBytes",
    "FilteringMessagesBeforePublishing",
    "Status",
    "CreatedAt",
    "UpdatedAt",
    "AccessedAt",
    "SupportOrdering",
    "CountDetails",
    "SubscriptionCount",
    "SqlFilterCount",
    "CorrelationFilterCount",
    "AutoDeleteOnIdle",
    "EnablePartitioning",
    "EntityAvailabilityStatus",
    "EnableExpress",
    "UserMetadata",
    "MaxMessageSizeInKilobytes",
)
# DefaultRuleDescription is deliberately absent: the SDK never sends one and the service does
# not return it; the $Default rule is served by the rules endpoints instead.
_SUBSCRIPTION_FIELDS: Final = _fields(
    "LockDuration",
    "RequiresSession",
    "DefaultMessageTimeToLive",
    "DeadLetteringOnMessageExpiration",
    "DeadLetteringOnFilterEvaluationExceptions",
    "MessageCount",
    "MaxDeliveryCount",
    "EnableBatchedOperations",
    "Status",
    "ForwardTo",
    "CreatedAt",
    "UpdatedAt",
    "AccessedAt",
    "CountDetails",
    "ForwardDeadLetteredMessagesTo",
    "AutoDeleteOnIdle",
    "EntityAvailabilityStatus",
    "UserMetadata",
)
_COUNT_FIELDS: Final = (
    ("ActiveMessageCount", "active_message_count"),
    ("DeadLetterMessageCount", "dead_letter_message_count"),
    ("ScheduledMessageCount", "scheduled_message_count"),
    ("TransferMessageCount", "transfer_message_count"),
    ("TransferDeadLetterMessageCount", "transfer_dead_letter_message_count"),
)
_DESCRIPTIONS: Final[dict[str, tuple[str, tuple[_Field, ...]]]] = {
    "queue": ("QueueDescription", _QUEUE_FIELDS),
    "topic": ("TopicDescription", _TOPIC_FIELDS),
    "subscription": ("SubscriptionDescription", _SUBSCRIPTION_FIELDS),
}
_DEFAULTS: Final[dict[str, dict[str, Any]]] = {
    "queue": {
        "lock_duration": timedelta(minutes=1),
        "max_size_in_megabytes": 1024,
        "requires_duplicate_detection": False,
        "requires_session": False,
        "default_message_time_to_live": TIMESPAN_MAX,
        "dead_lettering_on_message_expiration": False,
        "duplicate_detection_history_time_window": timedelta(minutes=10),
        "max_delivery_count": 10,
        "enable_batched_operations": True,
        "status": "Active",
        "auto_delete_on_idle": TIMESPAN_MAX,
        "enable_partitioning": False,
        "enable_express": False,
        "forward_to": None,
        "user_metadata": None,
        "forward_dead_lettered_messages_to": None,
        "max_message_size_in_kilobytes": 256,
    },
    "topic": {
        "default_message_time_to_live": TIMESPAN_MAX,
        "max_size_in_megabytes": 1024,
        "requires_duplicate_detection": False,
        "duplicate_detection_history_time_window": timedelta(minutes=10),
        "enable_batched_operations": True,
        "filtering_messages_before_publishing": False,
        "status": "Active",
        "support_ordering": True,
        "auto_delete_on_idle": TIMESPAN_MAX,
        "enable_partitioning": False,
        "enable_express": False,
        "user_metadata": None,
        "max_message_size_in_kilobytes": 256,
    },
    "subscription": {
        "lock_duration": timedelta(minutes=1),
        "requires_session": False,
        "default_message_time_to_live": TIMESPAN_MAX,
        "dead_lettering_on_message_expiration": False,
        "dead_lettering_on_filter_evaluation_exceptions": True,
        "max_delivery_count": 10,
        "enable_batched_operations": True,
        "status": "Active",
        "forward_to": None,
        "forward_dead_lettered_messages_to": None,
        "auto_delete_on_idle": TIMESPAN_MAX,
        "user_metadata": None,
    },
}


def default_properties(kind: str) -> dict[str, Any]:
    """Return the service's defaults (Standard tier) for every settable property of ``kind``.

    Args:
        kind: ``"queue"``, ``"topic"`` or ``"subscription"`` (an ``EntityKind`` works too).

    Returns:
        A new dict; ``None`` marks properties that are unset by default (e.g. ``forward_to``).
    """
    return dict(_DEFAULTS[kind])


def _atom(tag: str) -> str:
    return f"{{{_ATOM_NS}}}{tag}"


def _sb(tag: str) -> str:
    return f"{{{_SB_NS}}}{tag}"


def parse_description(body: bytes) -> tuple[str, dict[str, Any]]:
    """Parse the Atom entry the SDK PUTs to create or update a queue, topic or subscription.

    Only settable properties are returned, and only those present in the body: the SDK leaves
    out every property that is ``None`` on the client side. Read-only elements that the SDK
    echoes back on update (``MessageCount``, ``CreatedAt``, ``CountDetails``, ...) are ignored,
    as are elements this emulator does not model (``AuthorizationRules``, ...).

    Args:
        body: The raw request body.

    Returns:
        ``(kind, properties)`` with kind ``"queue"``, ``"topic"`` or ``"subscription"``.

    Raises:
        AtomError: The body is not well-formed, is not such an entry, or a value is invalid.
    """
    description = _single_description(body)
    for kind, (tag, fields) in _DESCRIPTIONS.items():
        if description.tag == _sb(tag):
            return kind, _parse_fields(description, fields)
    raise AtomError(f"Unsupported resource description {description.tag!r}.")


def _single_description(body: bytes) -> ET.Element:
    """The one description element inside the Atom entry of a PUT body."""
    # Entity expansion is the one XML feature ElementTree would honour that nobody needs here.
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise AtomError("Document type declarations are not allowed in a resource description.")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise AtomError(f"The resource description is not well-formed XML: {exc}.") from None
    content = root.find(_atom("content")) if root.tag == _atom("entry") else None
    if content is None or len(content) != 1:
        raise AtomError("The request body must be an Atom entry with one description in content.")
    return content[0]


def _parse_fields(description: ET.Element, fields: Sequence[_Field]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for field in fields:
        element = description.find(_sb(field.tag)) if field.writable else None
        if element is None:
            continue
        try:
            properties[field.key] = _PARSE[field.kind](element.text or "")
        except ValueError:
            raise AtomError(f"Invalid value for {field.tag}: {element.text!r}.") from None
    return properties


@dataclass(frozen=True)
class AtomContext:
    """Request-dependent values that appear in rendered links and entries.

    Attributes:
        base_url: Scheme and authority the client used, e.g. ``https://127.0.0.1:5443``.
        api_version: Echoed in links, as the service does.
        namespace: Namespace name, written as the entries' author and ``NamespaceInfo/Name``.
    """

    base_url: str
    api_version: str
    namespace: str

    def url(self, path: str, query: str = "") -> str:
        """Return the absolute URL of ``path`` with ``query`` and the api-version appended."""
        prefix = f"{query}&" if query else ""
        return f"{self.base_url}/{quote(path, safe='/$')}?{prefix}api-version={self.api_version}"


def _serialize(root: ET.Element) -> bytes:
    body: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return body


def _text(parent: ET.Element, tag: str, text: str, **attributes: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attributes)
    element.text = text
    return element


def _description(kind: str, properties: Mapping[str, Any]) -> ET.Element:
    tag, fields = _DESCRIPTIONS[kind]
    description = ET.Element(_sb(tag))
    for field in fields:
        if field.kind == "counts":
            # Always present: the SDK's runtime-properties getters dereference it unconditionally.
            counts = ET.SubElement(description, _sb("CountDetails"))
            for count_tag, key in _COUNT_FIELDS:
                _text(counts, f"{{{_COUNTS_NS}}}{count_tag}", str(int(properties.get(key) or 0)))
        elif (value := properties.get(field.key)) is not None:
            _text(description, _sb(field.tag), _FORMAT[field.kind](value))
    return description


def _entry(
    context: AtomContext,
    path: str,
    title: str,
    content: ET.Element,
    properties: Mapping[str, Any],
) -> ET.Element:
    now = datetime.now(UTC)
    entry = ET.Element(_atom("entry"))
    _text(entry, _atom("id"), context.url(path))
    _text(entry, _atom("title"), title, type="text")
    _text(entry, _atom("published"), _format_datetime(properties.get("created_at_utc") or now))
    _text(entry, _atom("updated"), _format_datetime(properties.get("updated_at_utc") or now))
    author = ET.SubElement(entry, _atom("author"))
    _text(author, _atom("name"), context.namespace)
    ET.SubElement(entry, _atom("link"), rel="self", href=context.url(path))
    ET.SubElement(entry, _atom("content"), type="application/xml").append(content)
    return entry


def _entity_entry(
    context: AtomContext, kind: str, path: str, properties: Mapping[str, Any]
) -> ET.Element:
    # A subscription's title is its own name, which the SDK's list_subscriptions uses as name.
    title = path.rsplit("/", 1)[-1] if kind == "subscription" else path
    return _entry(context, path, title, _description(kind, properties), properties)


def render_entry(
    context: AtomContext, kind: str, path: str, properties: Mapping[str, Any]
) -> bytes:
    """Render one queue, topic or subscription as the service returns it from GET or PUT.

    Args:
        context: Link and author values for this request.
        kind: ``"queue"``, ``"topic"`` or ``"subscription"``.
        path: Entity path; ``"{topic}/subscriptions/{name}"`` for a subscription.
        properties: Settable and runtime properties; ``None`` or missing ones are left out,
            except the message counts, which default to 0.

    Returns:
        The UTF-8 XML document.
    """
    return _serialize(_entity_entry(context, kind, path, properties))


def _feed(
    context: AtomContext, title: str, self_url: str, next_url: str | None, entries: list[ET.Element]
) -> bytes:
    feed = ET.Element(_atom("feed"))
    _text(feed, _atom("title"), title, type="text")
    _text(feed, _atom("id"), self_url)
    _text(feed, _atom("updated"), _format_datetime(datetime.now(UTC)))
    # The SDK pages on when a feed has exactly two links and takes $skip/$top from the second.
    ET.SubElement(feed, _atom("link"), rel="self", href=self_url)
    if next_url is not None:
        ET.SubElement(feed, _atom("link"), rel="next", href=next_url)
    feed.extend(entries)
    return _serialize(feed)


def render_entity_feed(
    context: AtomContext,
    kind: str,
    items: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    self_url: str,
    next_url: str | None,
) -> bytes:
    """Render one page of a queue, topic or subscription listing.

    Args:
        context: Link and author values for this request.
        kind: ``"queue"``, ``"topic"`` or ``"subscription"``.
        items: ``(path, properties)`` of the entities on this page.
        self_url: URL of this page.
        next_url: URL of the next page, or ``None`` on the last page.

    Returns:
        The UTF-8 XML document.
    """
    entries = [_entity_entry(context, kind, path, props) for path, props in items]
    title = {"queue": "Queues", "topic": "Topics"}.get(kind, "Subscriptions")
    return _feed(context, title, self_url, next_url, entries)


def render_empty_feed() -> bytes:
    """Render the empty feed the service answers a GET of a missing entity with (status 200).

    The SDK deserializes it as an entry, finds no ``content`` and raises ResourceNotFoundError.
    """
    feed = ET.Element(_atom("feed"))
    _text(feed, _atom("title"), "Publicly Listed Services", type="text")
    subtitle = "This is the list of publicly-listed services currently available."
    _text(feed, _atom("subtitle"), subtitle, type="text")
    _text(feed, _atom("id"), f"uuid:{uuid.uuid4()};id=1")
    _text(feed, _atom("updated"), _format_datetime(datetime.now(UTC)))
    _text(feed, _atom("generator"), "Service Bus 1.1")
    return _serialize(feed)


# -- rules ------------------------------------------------------------------------------------
_XSD_NS: Final = "http://www.w3.org/2001/XMLSchema"
_CORRELATION_TAGS: Final = {
    "correlation_id": "CorrelationId",
    "message_id": "MessageId",
    "to": "To",
    "reply_to": "ReplyTo",
    "label": "Label",
    "session_id": "SessionId",
    "reply_to_session_id": "ReplyToSessionId",
    "content_type": "ContentType",
}
assert set(_CORRELATION_TAGS) == set(CORRELATION_FIELDS)
# KeyValueOfstringanyType values: the XML Schema type names the SDK writes and reads.
_PARSE_VALUE: Final[dict[str, Callable[[str], Any]]] = {
    "string": str,
    "int": int,
    "long": int,
    "short": int,
    "double": float,
    "float": float,
    "decimal": float,
    "boolean": _parse_bool,
    "dateTime": lambda text: _parse_datetime(text),
    "duration": parse_duration,
}
_INT32_MAX: Final = 2**31 - 1


def _parse_datetime(text: str) -> datetime:
    # A value without an offset is taken as UTC, as the backend compares aware datetimes.
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _local_type(element: ET.Element) -> str:
    # xsi:type values carry a prefix of the writer's choosing ("d6p1:string"); only the local
    # name matters here.
    return element.get(_XSI_TYPE, "").rpartition(":")[2]


def _parse_key_values(parent: ET.Element | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if parent is None:
        return values
    for pair in parent.findall(_sb("KeyValueOfstringanyType")):
        key, value = pair.find(_sb("Key")), pair.find(_sb("Value"))
        if key is None or not key.text or value is None:
            raise AtomError("Every KeyValueOfstringanyType needs a Key and a Value.")
        kind = _local_type(value)
        parse = _PARSE_VALUE.get(kind)
        if parse is None:
            raise AtomError(
                f"The value of '{key.text}' has the unsupported type {kind!r}; use string, int, "
                "long, double, boolean, dateTime or duration."
            )
        try:
            values[key.text] = parse(value.text or "")
        except ValueError:
            raise AtomError(f"Invalid {kind} value for '{key.text}': {value.text!r}.") from None
    return values


def _child_text(parent: ET.Element, tag: str) -> str | None:
    element = parent.find(_sb(tag))
    return None if element is None else element.text or ""


def parse_rule(body: bytes) -> tuple[RuleFilter, RuleAction]:
    """Parse the Atom entry the SDK PUTs to create or update a rule.

    Args:
        body: The raw request body, holding a ``RuleDescription``.

    Returns:
        The rule's filter and action, validated (a SQL expression is parsed here).

    Raises:
        AtomError: The body is not such an entry, or a value is malformed.
        InvalidRuleError: The filter or action is not valid (e.g. bad SQL).
    """
    description = _single_description(body)
    if description.tag != _sb("RuleDescription"):
        raise AtomError(f"Expected a RuleDescription, got {description.tag!r}.")
    element = description.find(_sb("Filter"))
    kind = "TrueFilter" if element is None else _local_type(element)
    if element is None or kind == "TrueFilter":
        rule_filter = RuleFilter.true()
    elif kind == "FalseFilter":
        rule_filter = RuleFilter.false()
    elif kind == "SqlFilter":
        parameters = _parse_key_values(element.find(_sb("Parameters")))
        rule_filter = RuleFilter.sql(_child_text(element, "SqlExpression") or "", parameters)
    elif kind == "CorrelationFilter":
        fields = {key: _child_text(element, tag) for key, tag in _CORRELATION_TAGS.items()}
        properties = _parse_key_values(element.find(_sb("Properties")))
        rule_filter = RuleFilter.correlation_filter(fields, properties)
    else:
        raise AtomError(
            f"Unsupported filter type {kind!r}: use SqlFilter, CorrelationFilter, TrueFilter "
            "or FalseFilter."
        )
    element = description.find(_sb("Action"))
    kind = "EmptyRuleAction" if element is None else _local_type(element)
    if element is None or kind == "EmptyRuleAction":
        return rule_filter, RuleAction()
    if kind != "SqlRuleAction":
        raise AtomError(f"Unsupported action type {kind!r}: use SqlRuleAction or EmptyRuleAction.")
    parameters = _parse_key_values(element.find(_sb("Parameters")))
    return rule_filter, RuleAction.sql(_child_text(element, "SqlExpression") or "", parameters)


def _format_value(value: Any) -> tuple[str, str]:
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if isinstance(value, int):
        return ("int" if -_INT32_MAX - 1 <= value <= _INT32_MAX else "long"), str(value)
    if isinstance(value, float):
        return "double", repr(value)
    if isinstance(value, datetime):
        return "dateTime", _format_datetime(value)
    if isinstance(value, timedelta):
        return "duration", format_duration(value)
    return "string", str(value)


def _key_values(parent: ET.Element, tag: str, values: Mapping[str, Any]) -> None:
    if not values:
        return
    container = ET.SubElement(parent, _sb(tag))
    for key, value in values.items():
        pair = ET.SubElement(container, _sb("KeyValueOfstringanyType"))
        _text(pair, _sb("Key"), key)
        kind, text = _format_value(value)
        # The prefix must be declared where it is used: the SDK splits xsi:type on ":".
        _text(pair, _sb("Value"), text, **{_XSI_TYPE: f"d6p1:{kind}", "xmlns:d6p1": _XSD_NS})


def _sql_parts(parent: ET.Element, expression: str | None, parameters: Mapping[str, Any]) -> None:
    _text(parent, _sb("SqlExpression"), expression or "")
    _text(parent, _sb("CompatibilityLevel"), "20")
    _key_values(parent, "Parameters", parameters)


def _rule_entry(context: AtomContext, subscription_path: str, rule: Rule) -> ET.Element:
    description = ET.Element(_sb("RuleDescription"))
    rule_filter = rule.filter
    element = ET.SubElement(description, _sb("Filter"), {_XSI_TYPE: rule_filter.kind})
    if rule_filter.kind == "CorrelationFilter":
        for key, tag in _CORRELATION_TAGS.items():
            if (value := rule_filter.correlation.get(key)) is not None:
                _text(element, _sb(tag), value)
        _key_values(element, "Properties", rule_filter.properties)
    else:
        _sql_parts(element, rule_filter.sql_expression, rule_filter.parameters)
    # The SDK walks Filter and Action unconditionally when it reads rule parameters.
    action = ET.SubElement(description, _sb("Action"), {_XSI_TYPE: rule.action.kind})
    if rule.action.compiled is not None:
        _sql_parts(action, rule.action.sql_expression, rule.action.parameters)
    created_at = datetime.fromtimestamp(rule.created_at, UTC)
    _text(description, _sb("CreatedAt"), _format_datetime(created_at))
    _text(description, _sb("Name"), rule.name)
    path = f"{subscription_path}/rules/{rule.name}"
    return _entry(context, path, rule.name, description, {"created_at_utc": created_at})


def render_rule_entry(context: AtomContext, subscription_path: str, rule: Rule) -> bytes:
    """Render one rule as the service returns it from GET or PUT.

    Args:
        context: Link and author values for this request.
        subscription_path: ``"{topic}/subscriptions/{name}"``.
        rule: The rule.

    Returns:
        The UTF-8 XML document.
    """
    return _serialize(_rule_entry(context, subscription_path, rule))


def render_rule_feed(
    context: AtomContext,
    subscription_path: str,
    rules: Sequence[Rule],
    *,
    self_url: str,
    next_url: str | None,
) -> bytes:
    """Render one page of a subscription's rule listing.

    Args:
        context: Link and author values for this request.
        subscription_path: ``"{topic}/subscriptions/{name}"``.
        rules: The rules on this page.
        self_url: URL of this page.
        next_url: URL of the next page, or ``None`` on the last page.

    Returns:
        The UTF-8 XML document.
    """
    entries = [_rule_entry(context, subscription_path, rule) for rule in rules]
    return _feed(context, "Rules", self_url, next_url, entries)


def render_namespace_entry(context: AtomContext, *, created_at: datetime) -> bytes:
    """Render ``GET /$namespaceinfo`` for a Standard-tier messaging namespace.

    Args:
        context: Link values; ``context.namespace`` becomes the title and ``Name``.
        created_at: Reported as both creation and modification time.

    Returns:
        The UTF-8 XML document.
    """
    info = ET.Element(_sb("NamespaceInfo"))
    _text(info, _sb("CreatedTime"), _format_datetime(created_at))
    _text(info, _sb("MessagingSKU"), "Standard")
    _text(info, _sb("ModifiedTime"), _format_datetime(created_at))
    _text(info, _sb("Name"), context.namespace)
    _text(info, _sb("NamespaceType"), "Messaging")
    entry = _entry(
        context, "$namespaceinfo", context.namespace, info, {"created_at_utc": created_at}
    )
    return _serialize(entry)


def render_error(code: int, detail: str) -> bytes:
    """Render the service's error body, ``<Error><Code>..</Code><Detail>..</Detail></Error>``.

    The SDK turns ``Detail`` into the exception message.

    Args:
        code: HTTP status code.
        detail: Human-readable explanation; must not contain secrets.

    Returns:
        The UTF-8 XML document.
    """
    error = ET.Element("Error")
    _text(error, "Code", str(code))
    _text(error, "Detail", detail)
    return _serialize(error)
