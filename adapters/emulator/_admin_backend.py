"""Binds the admin HTTPS endpoint (``_admin``) to one namespace's broker state."""

from __future__ import annotations

__all__ = ["NamespaceAdminBackend"]

import dataclasses
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from ._admin import (
    AdminAuthError,
    EntityExistsError,
    EntityKind,
    EntityNotFoundError,
    InvalidEntityError,
    QuotaExceededError,
)
from ._broker import (
    PARTITION_COUNT,
    PARTITIONED_SIZES_MB,
    BrokerError,
    Entity,
    EntityProperties,
    SubscriptionProperties,
    Topic,
    check_partitioned_size,
)
from ._namespace_host import NamespaceHost
from ._rules import RuleSet
from ._sas import MANAGE

_IMMUTABLE = ("requires_session", "enable_partitioning")


def _properties_of(
    kind: EntityKind, values: dict[str, Any]
) -> EntityProperties | SubscriptionProperties:
    cls: type[EntityProperties] | type[SubscriptionProperties] = (
        SubscriptionProperties if kind is EntityKind.SUBSCRIPTION else EntityProperties
    )
    known = {f.name for f in dataclasses.fields(cls)}
    settable = {k: v for k, v in values.items() if k in known and v is not None}
    try:
        properties = cls(**settable)
    except TypeError as exc:
        raise InvalidEntityError(f"Invalid entity description: {exc}") from None
    if getattr(properties, "max_delivery_count", 1) < 1:
        raise InvalidEntityError("MaxDeliveryCount must be at least 1.")
    if (
        properties.lock_duration.total_seconds() > 300
        if hasattr(properties, "lock_duration")
        else False
    ):
        raise InvalidEntityError("LockDuration must be at most 5 minutes.")
    return properties


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class NamespaceAdminBackend:
    """The :class:`~georep.adapters.emulator._admin.AdminBackend` of one namespace."""

    def __init__(self, server: NamespaceHost) -> None:
        self._server = server

    @property
    def _namespace(self) -> Any:
        return self._server.namespace

    def authorize(self, authorization: str | None, url: str) -> None:
        if not authorization:
            raise AdminAuthError(
                "MalformedToken: The request has no Authorization header with a SAS token."
            )
        # A SAS-token credential reaches us through the SDK's bearer-token policy.
        token = authorization.removeprefix("Bearer ")
        try:
            granted = self._server.grant(token)
        except PermissionError as exc:
            raise AdminAuthError(f"InvalidSignature: {exc}") from None
        path = urlsplit(url).path.strip("/")
        # Listing ($Resources/queues, ...) spans the namespace: only a namespace token may.
        target = "" if path.lower().startswith("$resources") else path
        try:
            granted.require(target)
        except PermissionError as exc:
            raise AdminAuthError(str(exc)) from None
        if MANAGE not in granted.rights:
            raise AdminAuthError(
                f"Unauthorized: 'Manage' claim is required for the management API; rule "
                f"'{granted.rule}' has {', '.join(sorted(granted.rights))}."
            )

    # -- views ----------------------------------------------------------------------------
    def _describe(self, kind: EntityKind, target: Entity | Topic) -> dict[str, Any]:
        values = dataclasses.asdict(target.properties)
        if isinstance(target, Topic):
            runtime: dict[str, Any] = {
                "size_in_bytes": sum(s.size_in_bytes for s in target.subscriptions.values()),
                "subscription_count": len(target.subscriptions),
                "sql_filter_count": sum(r.count("SqlFilter") for r in target.rules.values()),
                "correlation_filter_count": sum(
                    r.count("CorrelationFilter") for r in target.rules.values()
                ),
                "scheduled_message_count": sum(
                    len(s.scheduled) for s in target.subscriptions.values()
                ),
                "active_message_count": 0,
                "dead_letter_message_count": 0,
                "transfer_message_count": 0,
                "transfer_dead_letter_message_count": 0,
                "created_at_utc": _utc(target.created_at),
                "updated_at_utc": _utc(target.updated_at),
                "accessed_at_utc": _utc(target.updated_at),
            }
        else:
            runtime = target.runtime()
            for key in ("created_at_utc", "updated_at_utc", "accessed_at_utc"):
                runtime[key] = _utc(runtime[key])
        if kind is not EntityKind.SUBSCRIPTION and values.get("enable_partitioning"):
            # Standard tier: 16 fragments, so the reported size is 16x the per-fragment size.
            values["max_size_in_megabytes"] = values["max_size_in_megabytes"] * PARTITION_COUNT
        values["availability_status"] = "Available"
        values.update(runtime)
        return values

    def _lookup(self, kind: EntityKind, path: str) -> Entity | Topic | None:
        ns = self._namespace
        if kind is EntityKind.QUEUE:
            return ns.queues.get(path)  # type: ignore[no-any-return]
        if kind is EntityKind.TOPIC:
            return ns.topics.get(path)  # type: ignore[no-any-return]
        topic_name, _, subscription = path.rpartition("/subscriptions/")
        topic = ns.topics.get(topic_name)
        return topic.subscriptions.get(subscription) if topic is not None else None

    # -- operations ---------------------------------------------------------------------
    def create_entity(
        self, kind: EntityKind, path: str, properties: dict[str, Any]
    ) -> dict[str, Any]:
        ns = self._namespace
        settings = _properties_of(kind, properties)
        try:
            if kind is EntityKind.QUEUE:
                target: Entity | Topic = ns.create_queue(path, settings)
            elif kind is EntityKind.TOPIC:
                target = ns.create_topic(path, settings)
            else:
                topic_name, _, subscription = path.rpartition("/subscriptions/")
                target = ns.create_subscription(topic_name, subscription, settings)
        except BrokerError as exc:
            if exc.condition == "amqp:not-found":
                raise EntityNotFoundError(exc.description) from None
            if exc.condition == "amqp:resource-limit-exceeded":
                raise QuotaExceededError(exc.description) from None
            if exc.condition == "amqp:invalid-field":
                raise InvalidEntityError(exc.description) from None
            raise EntityExistsError(exc.description) from None
        return self._describe(kind, target)

    def update_entity(
        self, kind: EntityKind, path: str, properties: dict[str, Any]
    ) -> dict[str, Any]:
        target = self._lookup(kind, path)
        if target is None:
            raise EntityNotFoundError(f"The messaging entity '{path}' could not be found.")
        settings = _properties_of(kind, properties)
        for name in _IMMUTABLE:
            if getattr(settings, name, None) != getattr(target.properties, name, None):
                raise InvalidEntityError(
                    f"The value for the {name} property of an existing entity cannot be changed; "
                    "delete and recreate the entity instead."
                )
        if isinstance(settings, EntityProperties) and settings.enable_partitioning:
            size = settings.max_size_in_megabytes
            # An update usually sends back the size it read, which is 16x the per-fragment size.
            if size not in PARTITIONED_SIZES_MB and size / PARTITION_COUNT in PARTITIONED_SIZES_MB:
                size //= PARTITION_COUNT
                settings = dataclasses.replace(settings, max_size_in_megabytes=size)
            try:
                check_partitioned_size(size)
            except BrokerError as exc:
                raise InvalidEntityError(exc.description) from None
        target.properties = settings
        if isinstance(target, Entity) and target.dead_letter is not None:
            target.dead_letter.properties = settings
        target.updated_at = self._namespace.clock()
        return self._describe(kind, target)

    def get_entity(self, kind: EntityKind, path: str) -> dict[str, Any] | None:
        target = self._lookup(kind, path)
        return None if target is None else self._describe(kind, target)

    def list_entities(
        self, kind: EntityKind, parent: str | None
    ) -> list[tuple[str, dict[str, Any]]]:
        ns = self._namespace
        if kind is EntityKind.QUEUE:
            return [(path, self._describe(kind, e)) for path, e in ns.queues.items()]
        if kind is EntityKind.TOPIC:
            return [(path, self._describe(kind, t)) for path, t in ns.topics.items()]
        topic = ns.topics.get(parent)
        if topic is None:
            return []
        return [
            (f"{parent}/subscriptions/{name}", self._describe(kind, e))
            for name, e in topic.subscriptions.items()
        ]

    def delete_entity(self, kind: EntityKind, path: str) -> bool:
        ns = self._namespace
        if kind is EntityKind.SUBSCRIPTION:
            topic_name, _, subscription = path.rpartition("/subscriptions/")
            topic = ns.topics.get(topic_name)
            if topic is None or subscription not in topic.subscriptions:
                return False
            topic.subscriptions.pop(subscription).purge()
            topic.rules.pop(subscription, None)
            return True
        if kind is EntityKind.QUEUE and path not in ns.queues:
            return False
        if kind is EntityKind.TOPIC and path not in ns.topics:
            return False
        return bool(ns.delete(path))

    def rules(self, subscription_path: str) -> RuleSet | None:
        topic_name, _, subscription = subscription_path.rpartition("/subscriptions/")
        topic = self._namespace.topics.get(topic_name)
        if topic is None or subscription not in topic.subscriptions:
            return None
        rules: RuleSet | None = topic.rules.get(subscription)
        return rules

    def now(self) -> float:
        now: float = self._namespace.clock()
        return now
