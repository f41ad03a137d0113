"""How georep reads, copies, stores and batches azure-servicebus messages."""

from __future__ import annotations

__all__ = ["GeoMessageBatch", "ServiceBusCodec"]

import base64
import copy
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import MessageSizeExceededError

from georep.exceptions import InvalidMessageError, OversizeMessageError

_FORMAT_VERSION = 1

_PARTITION_KEY = b"x-opt-partition-key"
_PARTITION_KEY_TEXT = "x-opt-partition-key"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


# ServiceBusMessage fields kept in the AMQP properties section, with their AMQP names.
_PROPERTY_FIELDS = (
    ("message_id", "message_id"),
    ("session_id", "group_id"),
    ("content_type", "content_type"),
    ("correlation_id", "correlation_id"),
    ("subject", "subject"),
    ("to", "to"),
    ("reply_to", "reply_to"),
    ("reply_to_session_id", "reply_to_group_id"),
)


class GeoMessageBatch(ServiceBusMessageBatch):
    """A ServiceBusMessageBatch that checks each message and gives it its MessageId as it
    is added, so that sending it checks nothing again (:meth:`ServiceBusCodec.prepared_ids`).

    Returned by ``GeoSender.create_message_batch``; use it exactly like the SDK's batch.
    """

    def __init__(
        self, max_size_in_bytes: int, prepare: Callable[[Any], object], **kwargs: Any
    ) -> None:
        super().__init__(max_size_in_bytes, **kwargs)
        self._georep_prepare = prepare
        self._georep_ids: list[str] = []
        self._georep_keys: set[str] = set()

    def add_message(self, message: ServiceBusMessage | Mapping[str, Any] | Any) -> None:
        if isinstance(message, Mapping):
            message = _from_mapping(message)
        if isinstance(message, AmqpAnnotatedMessage):
            message = _from_amqp(message)
        _check_message(message)
        key = _partition_of(message)
        message_id = self._georep_prepare(message)
        try:
            super().add_message(message)
        except MessageSizeExceededError as exc:  # the batch is full, as in the SDK
            raise OversizeMessageError(str(exc)) from exc
        self._georep_ids.append(str(message_id))
        if key is not None:
            self._georep_keys.add(key)


_FROM_AMQP = "_georep_amqp"
"""Set on a ServiceBusMessage made around an AmqpAnnotatedMessage: copies copy every section."""


def _from_amqp(message: AmqpAnnotatedMessage) -> ServiceBusMessage:
    """A ServiceBusMessage over ``message`` itself, as the SDK's sender makes one to send it:
    its fields (MessageId, session...) read and write the annotated message's sections."""
    wrapped = ServiceBusMessage(None, message=None, raw_amqp_message=message)
    setattr(wrapped, _FROM_AMQP, True)
    return wrapped


def _amqp_body(message: ServiceBusMessage) -> Any:
    """A value body as it is, a sequence body as the list of its sections."""
    body = message.body
    return body if message.body_type == AmqpMessageBodyType.VALUE else list(body)


def _body_bytes(message: ServiceBusMessage) -> bytes:
    body = message.body
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    return b"".join(body)


def _tag(value: Any) -> list[Any]:
    """A JSON-safe, type-preserving form of an application property key or value."""
    if value is None:
        return ["n", None]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", value]
    if isinstance(value, float):
        return ["f", value]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, bytes | bytearray | memoryview):
        return ["y", base64.b64encode(bytes(value)).decode("ascii")]
    if isinstance(value, uuid.UUID):
        return ["u", str(value)]
    if isinstance(value, datetime):
        return ["t", value.isoformat()]
    if isinstance(value, list | tuple):  # an AMQP value or sequence body's lists and maps
        return ["l", [_tag(item) for item in value]]
    if isinstance(value, Mapping):
        return ["m", [[_tag(k), _tag(v)] for k, v in value.items()]]
    raise InvalidMessageError(
        f"a value of type {type(value).__name__} (application property or AMQP body) cannot "
        "be stored in the outbox: use str, bytes, int, float, bool, UUID or datetime"
    )


def _untag(tagged: list[Any]) -> Any:
    kind, value = tagged
    if kind == "y":
        return base64.b64decode(value)
    if kind == "u":
        return uuid.UUID(value)
    if kind == "t":
        return datetime.fromisoformat(value)
    if kind == "l":
        return [_untag(item) for item in value]
    if kind == "m":
        return {_untag(k): _untag(v) for k, v in value}
    return value


#: The fields a dict message may have (``ServiceBusMessage``'s keywords, and ``body``).
_MESSAGE_FIELDS = frozenset(
    {
        "body",
        "application_properties",
        "session_id",
        "message_id",
        "scheduled_enqueue_time_utc",
        "time_to_live",
        "content_type",
        "correlation_id",
        "subject",
        "partition_key",
        "to",
        "reply_to",
        "reply_to_session_id",
    }
)

#: Service Bus limits on identifiers, in characters.
_MAX_ID_LENGTH = 128

#: Application property value types the SDK encodes and the service and the outbox keep.
_PROPERTY_TYPES = (str, bytes, int, float, bool, uuid.UUID, datetime, type(None))
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def _from_mapping(fields: Mapping[str, Any]) -> ServiceBusMessage:
    """A ServiceBusMessage from a dict of its fields, or a clear error.

    Raises:
        InvalidMessageError: A field is unknown (the SDK would silently drop it), ``body``
            is missing, or the SDK refuses a value.
    """
    unknown = sorted(str(name) for name in fields if name not in _MESSAGE_FIELDS)
    if unknown:
        raise InvalidMessageError(
            f"a dict message has unknown field(s) {', '.join(unknown)}: use only "
            f"{', '.join(sorted(_MESSAGE_FIELDS))} (custom data goes in application_properties)"
        )
    if "body" not in fields:
        raise InvalidMessageError("a dict message needs a 'body' field (bytes or str)")
    try:
        return ServiceBusMessage(**fields)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"a dict message was refused by the SDK: {exc}") from exc


def _check_identifier(name: str, value: Any, message_id: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        fix = " (decode it: value.decode())" if isinstance(value, bytes | bytearray) else ""
        raise InvalidMessageError(
            f"{name} must be a str, got {type(value).__name__}{fix}"
            + ("" if name == "message_id" else f" (message {message_id!r})")
        )
    if len(value) > _MAX_ID_LENGTH:
        raise InvalidMessageError(
            f"{name} {value[:20]!r}... is {len(value)} characters; Service Bus allows at most "
            f"{_MAX_ID_LENGTH}: shorten it (or hash it)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(
            f"{name} {value!r} is not valid Unicode text ({exc.reason}): use text that "
            "encodes as UTF-8"
        ) from None


def _check_property(message_id: Any, key: Any, value: Any) -> None:
    if not isinstance(key, str | bytes):
        raise InvalidMessageError(
            f"message {message_id!r}: application property key {key!r} is a "
            f"{type(key).__name__}; keys must be str"
        )
    if not isinstance(value, _PROPERTY_TYPES):
        raise InvalidMessageError(
            f"message {message_id!r}: application property {key!r} is a "
            f"{type(value).__name__}; use str, bytes, int, float, bool, UUID, datetime or None"
        )
    if isinstance(value, int) and not _LONG_MIN <= value <= _LONG_MAX:
        raise InvalidMessageError(
            f"message {message_id!r}: application property {key!r} = {value} does not fit a "
            "64-bit integer: send it as a str"
        )


def _partition_of(message: ServiceBusMessage) -> str | None:
    """The partition ``message`` goes to: its session id, else its partition key, else None.

    Raises:
        InvalidMessageError: It has both, and they differ.
    """
    raw = message.raw_amqp_message
    properties = raw.properties
    session = _text(properties.group_id) if properties is not None else None
    annotations = raw.annotations
    partition = (
        _text(annotations.get(_PARTITION_KEY) or annotations.get(_PARTITION_KEY_TEXT))
        if annotations
        else None
    )
    if session is not None and partition is not None and session != partition:
        message_id = _text(properties.message_id) if properties is not None else None
        raise InvalidMessageError(
            f"message {message_id!r} has session_id {session!r} and a "
            f"different partition_key {partition!r}: Service Bus refuses that; leave "
            "partition_key unset (the session id is the partition key) or make them equal"
        )
    return session if session is not None else partition


def _check_one_partition(keys: set[str], one_partition: bool) -> None:
    if one_partition and len(keys) > 1:
        raise InvalidMessageError(
            f"a batch for a partitioned entity must use one partition key, this one mixes "
            f"{len(keys)} ({', '.join(sorted(keys)[:3])}...): send one batch per key"
        )


def _check_message(message: Any) -> int:
    """Refuse what the service (or a failover copy) would refuse; the body size in bytes.

    Raises:
        InvalidMessageError: naming the message, the field and the fix.
    """
    if not isinstance(message, ServiceBusMessage):
        raise InvalidMessageError(
            f"cannot send a {type(message).__name__}: expected a ServiceBusMessage"
        )
    raw = message.raw_amqp_message
    properties = raw.properties
    message_id = None
    if properties is not None:
        message_id = properties.message_id
        _check_identifier("message_id", message_id, message_id)
        _check_identifier("session_id", properties.group_id, message_id)
    application_properties = raw.application_properties
    if application_properties:
        for key, value in application_properties.items():
            _check_property(message_id, key, value)
    if message.body_type != AmqpMessageBodyType.DATA:
        _tag(_amqp_body(message))  # what the outbox could not keep is refused now, not there
        return 0  # no lower bound of an AMQP value's encoded size without encoding it
    body = message.body
    if body is None:
        return 0
    if isinstance(body, bytes):
        return len(body)
    return sum(len(part) for part in body)


class ServiceBusCodec:
    """The :class:`georep.ports.MessageCodec` for azure-servicebus messages."""

    def __init__(self, amqp_transport: Any = None) -> None:
        # The SDK rebuilds (re-encodes) a batch made for another transport class; batches
        # we create use the sender's own.
        self._batch_kwargs = {} if amqp_transport is None else {"amqp_transport": amqp_transport}

    def split(self, messages: Any) -> list[Any]:
        if isinstance(messages, ServiceBusMessage):
            return [messages]
        if isinstance(messages, ServiceBusMessageBatch):
            # The SDK keeps the messages it batched; georep needs them to copy or persist.
            return list(messages._messages)
        if isinstance(messages, Mapping):
            return [_from_mapping(messages)]
        if isinstance(messages, AmqpAnnotatedMessage):
            return [_from_amqp(messages)]
        if isinstance(messages, Iterable) and not isinstance(messages, str | bytes):
            result: list[Any] = []
            for message in messages:
                if isinstance(message, Mapping):
                    message = _from_mapping(message)
                elif isinstance(message, AmqpAnnotatedMessage):
                    message = _from_amqp(message)
                elif not isinstance(message, ServiceBusMessage):
                    raise InvalidMessageError(
                        f"cannot send a {type(message).__name__} in a list: expected "
                        "ServiceBusMessage or AmqpAnnotatedMessage objects"
                    )
                result.append(message)
            return result
        raise InvalidMessageError(
            f"cannot send a {type(messages).__name__}: pass a ServiceBusMessage, a list of "
            "them, or a batch from create_message_batch()"
        )

    def is_batch(self, messages: Any) -> bool:
        return isinstance(messages, ServiceBusMessageBatch)

    # MessageId is read and set through the AMQP properties object directly: the SDK's
    # ServiceBusMessage.message_id tests the properties' truthiness, which lists every
    # field (~5 us a call, on every send).
    def message_id(self, message: Any) -> str | None:
        properties = message.raw_amqp_message.properties
        return None if properties is None else _text(properties.message_id)

    def set_message_id(self, message: Any, message_id: str) -> None:
        properties = message.raw_amqp_message.properties
        if properties is None:
            message.message_id = message_id
        else:
            properties.message_id = message_id

    def subject(self, message: Any) -> str | None:
        value = message.subject
        return None if value is None else str(value)

    def session_id(self, message: Any) -> str | None:
        # Through the AMQP properties too, as message_id (the SDK getter is slow).
        properties = message.raw_amqp_message.properties
        return None if properties is None else _text(properties.group_id)

    def application_property(self, message: Any, name: str) -> Any:
        properties = message.application_properties
        if not properties:
            return None
        if name in properties:
            return properties[name]
        # Received messages carry bytes keys (SDK behaviour).
        return properties.get(name.encode())

    def set_application_property(self, message: Any, name: str, value: str) -> None:
        properties = message.application_properties
        if properties is None:
            message.application_properties = {name: value}
        else:
            properties[name] = value

    def _fields(self, message: ServiceBusMessage) -> dict[str, Any]:
        # Each SDK getter first tests its section's truthiness, which lists every field
        # (~5 us); the raw AMQP sections say which fields are set, so only those are read.
        raw = message.raw_amqp_message
        fields: dict[str, Any] = {}
        properties = raw.properties
        if properties is not None:
            for name, amqp_name in _PROPERTY_FIELDS:
                if getattr(properties, amqp_name, None) is not None:
                    fields[name] = getattr(message, name)
        if raw.annotations:
            fields["partition_key"] = message.partition_key
            fields["scheduled_enqueue_time_utc"] = message.scheduled_enqueue_time_utc
        if raw.header is not None and raw.header.time_to_live:
            fields["time_to_live"] = message.time_to_live
        application_properties = message.application_properties
        if application_properties:
            fields["application_properties"] = dict(application_properties)
        return fields

    def time_to_live(self, message: Any) -> float | None:
        header = message.raw_amqp_message.header
        if header is None or not header.time_to_live:
            return None
        # The AMQP header holds milliseconds.
        return float(header.time_to_live) / 1000.0

    def set_time_to_live(self, message: Any, seconds: float) -> None:
        message.time_to_live = timedelta(seconds=seconds)

    def copy(self, message: Any) -> Any:
        if getattr(message, _FROM_AMQP, False) or message.body_type != AmqpMessageBodyType.DATA:
            # Every section as it is (header, footer, annotations...), body included.
            return _from_amqp(copy.deepcopy(message.raw_amqp_message))
        return ServiceBusMessage(_body_bytes(message), **self._fields(message))

    def encode(self, message: Any) -> bytes:
        fields = self._fields(message)
        properties = fields.pop("application_properties", None) or {}
        ttl: timedelta | None = fields.pop("time_to_live", None)
        scheduled: datetime | None = fields.pop("scheduled_enqueue_time_utc", None)
        document: dict[str, Any] = {"v": _FORMAT_VERSION}
        kind = message.body_type
        if kind == AmqpMessageBodyType.DATA:
            document["body"] = base64.b64encode(_body_bytes(message)).decode("ascii")
        else:  # an AmqpAnnotatedMessage's value or sequence body, tagged as properties are
            document["body"] = ""
            document["amqp"] = [kind.value, _tag(_amqp_body(message))]
        document |= {
            "fields": {k: v for k, v in fields.items() if v is not None},
            "properties": [[_tag(k), _tag(v)] for k, v in properties.items()],
            "ttl": None if ttl is None else ttl.total_seconds(),
            "scheduled": None if scheduled is None else scheduled.isoformat(),
        }
        return json.dumps(document, separators=(",", ":")).encode()

    def decode(self, payload: bytes) -> Any:
        document = json.loads(payload)
        if document.get("v") != _FORMAT_VERSION:
            raise InvalidMessageError(
                f"outbox entry format {document.get('v')!r} is unknown to this georep version"
            )
        properties = {_untag(k): _untag(v) for k, v in document["properties"]}
        ttl = document["ttl"]
        scheduled = document["scheduled"]
        message = ServiceBusMessage(
            base64.b64decode(document["body"]),
            application_properties=properties or None,
            time_to_live=None if ttl is None else timedelta(seconds=ttl),
            scheduled_enqueue_time_utc=None
            if scheduled is None
            else datetime.fromisoformat(scheduled),
            **document["fields"],
        )
        if "amqp" not in document:
            return message
        kind, tagged = document["amqp"]
        raw = message.raw_amqp_message  # the sections the fields made, around the body
        sections: dict[str, Any] = {
            "properties": raw.properties,
            "application_properties": raw.application_properties,
            "annotations": raw.annotations,
            "header": raw.header,
        }
        body_key = "value_body" if kind == AmqpMessageBodyType.VALUE.value else "sequence_body"
        return _from_amqp(AmqpAnnotatedMessage(**{body_key: _untag(tagged)}, **sections))

    def check(
        self, messages: Sequence[Any], *, one_partition: bool, max_size: int | None = None
    ) -> None:
        keys: set[str] = set()
        body_bytes = 0
        largest, largest_bytes = None, -1
        for message in messages:
            size = _check_message(message)
            body_bytes += size
            if size > largest_bytes:
                largest, largest_bytes = message, size
            key = _partition_of(message)
            if key is not None:
                keys.add(key)
        if max_size is not None and body_bytes > max_size:
            # The bodies alone are a lower bound of the encoded size: over the limit for sure.
            raise OversizeMessageError(
                self._over_limit(messages, body_bytes, max_size, largest, largest_bytes)
            )
        _check_one_partition(keys, one_partition)

    def prepared_ids(
        self, payload: Any, *, one_partition: bool, max_size: int | None = None
    ) -> tuple[str, ...] | None:
        if not isinstance(payload, GeoMessageBatch) or (
            max_size is not None and payload.size_in_bytes > max_size
        ):
            return None  # checked message by message (and an oversize one explained) there
        _check_one_partition(payload._georep_keys, one_partition)
        return tuple(payload._georep_ids)

    def _over_limit(
        self,
        messages: Sequence[Any],
        body_bytes: int,
        max_size: int,
        largest: Any,
        largest_bytes: int,
    ) -> str:
        """Why ``messages`` are refused: one message is named; several are told to split
        unless one of them is over the limit on its own (splitting would not help it)."""
        limit = f"the entity's limit of {max_size} bytes"
        if len(messages) > 1 and largest_bytes <= max_size:
            return (
                f"{len(messages)} messages together have {body_bytes} bytes of body, over "
                f"{limit}: send fewer messages per call (or shrink their bodies)"
            )
        message_id = self.message_id(largest)
        named = "a message without a MessageId" if message_id is None else f"message {message_id!r}"
        among = "" if len(messages) == 1 else f" (one of {len(messages)} in this call)"
        return (
            f"{named}{among} has {largest_bytes} bytes of body, over {limit}: shrink its "
            "body (e.g. store the payload elsewhere and send a reference to it)"
        )

    def new_batch(self, max_size_in_bytes: int, prepare: Callable[[Any], object]) -> Any:
        return GeoMessageBatch(max_size_in_bytes, prepare, **self._batch_kwargs)
