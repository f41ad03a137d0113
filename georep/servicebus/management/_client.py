"""The drop-in ``ServiceBusAdministrationClient`` over two namespaces (blocking).

As ``azure.servicebus.management.ServiceBusAdministrationClient``: every create, update
and delete is applied to both namespaces (the paired-namespace guidance: every entity in
both, with the same settings); gets and lists answer with the primary's properties,
annotated with ``georep_regions`` and ``georep_differences`` (see
:mod:`georep.servicebus._admin`). Lists are returned as lists, not pages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, cast

from azure.servicebus.management import (
    NamespaceProperties,
    QueueProperties,
    QueueRuntimeProperties,
    RuleProperties,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)
from azure.servicebus.management import ServiceBusAdministrationClient as _SdkAdmin

from georep._endpoint import endpoint_pair
from georep.exceptions import AllRegionsUnavailableError
from georep.servicebus._admin import REGIONS, changed, merge_listed, read

__all__ = ["ServiceBusAdministrationClient"]


class ServiceBusAdministrationClient:
    """Manage the entities of two namespaces as one.

    Args:
        primary: The primary namespace's SDK administration client (owned by this object).
        secondary: The secondary's.
    """

    def __init__(self, primary: _SdkAdmin, secondary: _SdkAdmin) -> None:
        self._clients = dict(zip(REGIONS, (primary, secondary), strict=True))

    @classmethod
    def from_connection_strings(cls, primary: str, secondary: str, **kwargs: Any) -> Self:
        """Clients on both namespaces; ``kwargs`` go to both (``connection_verify``...)."""
        return cls(
            _SdkAdmin.from_connection_string(primary, **kwargs),
            _SdkAdmin.from_connection_string(secondary, **kwargs),
        )

    @classmethod
    def from_namespaces(cls, primary: str, secondary: str, credential: Any, **kwargs: Any) -> Self:
        """Clients on both namespaces reached with ``credential`` (the SDK's credentials)."""
        first, second = endpoint_pair(primary, secondary, credential, None)
        return cls(
            _SdkAdmin(primary, first.credential, **kwargs),
            _SdkAdmin(secondary, second.credential, **kwargs),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close both namespaces' clients."""
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()

    def _both(self, operation: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Each region's answer (or error) to ``operation``, one region after the other."""
        answers: dict[str, Any] = {}
        for region, client in self._clients.items():
            try:
                answers[region] = getattr(client, operation)(*args, **kwargs)
            except Exception as exc:
                answers[region] = exc
        return answers

    def _list(self, operation: str, *args: Any, **kwargs: Any) -> list[Any]:
        by_region: dict[str, Any] = {}
        for region, client in self._clients.items():
            try:
                by_region[region] = list(getattr(client, operation)(*args, **kwargs))
            except Exception as exc:
                by_region[region] = exc
        answered = {r: a for r, a in by_region.items() if not isinstance(a, BaseException)}
        if not answered:
            errors = {r: a for r, a in by_region.items() if isinstance(a, BaseException)}
            raise AllRegionsUnavailableError(f"no namespace answered {operation}", errors)
        return merge_listed(answered)

    def create_queue(self, queue_name: str, **kwargs: Any) -> QueueProperties:
        """Create the queue in both namespaces (the SDK's arguments)."""
        return cast(
            QueueProperties,
            changed("create_queue", self._both("create_queue", queue_name, **kwargs)),
        )

    def get_queue(self, queue_name: str, **kwargs: Any) -> QueueProperties:
        """The queue's properties (the primary's), annotated with both regions'."""
        return cast(
            QueueProperties, read("get_queue", self._both("get_queue", queue_name, **kwargs))
        )

    def get_queue_runtime_properties(
        self, queue_name: str, **kwargs: Any
    ) -> QueueRuntimeProperties:
        """The queue's runtime properties (the primary's), annotated with both regions'."""
        return cast(
            QueueRuntimeProperties,
            read(
                "get_queue_runtime_properties",
                self._both("get_queue_runtime_properties", queue_name, **kwargs),
            ),
        )

    def update_queue(self, queue: QueueProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Apply the same settings to the queue in both namespaces."""
        changed("update_queue", self._both("update_queue", queue, **kwargs))

    def delete_queue(self, queue_name: str, **kwargs: Any) -> None:
        """Delete the queue in both namespaces."""
        changed("delete_queue", self._both("delete_queue", queue_name, **kwargs))

    def list_queues(self, **kwargs: Any) -> list[QueueProperties]:
        """Every queue of either namespace, each annotated with the regions that have it."""
        return self._list("list_queues", **kwargs)

    def list_queues_runtime_properties(self, **kwargs: Any) -> list[QueueRuntimeProperties]:
        """Every queue's runtime properties, each annotated with both regions'."""
        return self._list("list_queues_runtime_properties", **kwargs)

    def create_topic(self, topic_name: str, **kwargs: Any) -> TopicProperties:
        """Create the topic in both namespaces (the SDK's arguments)."""
        return cast(
            TopicProperties,
            changed("create_topic", self._both("create_topic", topic_name, **kwargs)),
        )

    def get_topic(self, topic_name: str, **kwargs: Any) -> TopicProperties:
        """The topic's properties (the primary's), annotated with both regions'."""
        return cast(
            TopicProperties, read("get_topic", self._both("get_topic", topic_name, **kwargs))
        )

    def get_topic_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> TopicRuntimeProperties:
        """The topic's runtime properties (the primary's), annotated with both regions'."""
        return cast(
            TopicRuntimeProperties,
            read(
                "get_topic_runtime_properties",
                self._both("get_topic_runtime_properties", topic_name, **kwargs),
            ),
        )

    def update_topic(self, topic: TopicProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Apply the same settings to the topic in both namespaces."""
        changed("update_topic", self._both("update_topic", topic, **kwargs))

    def delete_topic(self, topic_name: str, **kwargs: Any) -> None:
        """Delete the topic in both namespaces."""
        changed("delete_topic", self._both("delete_topic", topic_name, **kwargs))

    def list_topics(self, **kwargs: Any) -> list[TopicProperties]:
        """Every topic of either namespace, each annotated with the regions that have it."""
        return self._list("list_topics", **kwargs)

    def list_topics_runtime_properties(self, **kwargs: Any) -> list[TopicRuntimeProperties]:
        """Every topic's runtime properties, each annotated with both regions'."""
        return self._list("list_topics_runtime_properties", **kwargs)

    def create_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionProperties:
        """Create the subscription in both namespaces (the SDK's arguments)."""
        return cast(
            SubscriptionProperties,
            changed(
                "create_subscription",
                self._both("create_subscription", topic_name, subscription_name, **kwargs),
            ),
        )

    def get_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionProperties:
        """The subscription's properties (the primary's), annotated with both regions'."""
        return cast(
            SubscriptionProperties,
            read(
                "get_subscription",
                self._both("get_subscription", topic_name, subscription_name, **kwargs),
            ),
        )

    def get_subscription_runtime_properties(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionRuntimeProperties:
        """The subscription's runtime properties (the primary's), annotated with both regions'."""
        return cast(
            SubscriptionRuntimeProperties,
            read(
                "get_subscription_runtime_properties",
                self._both(
                    "get_subscription_runtime_properties", topic_name, subscription_name, **kwargs
                ),
            ),
        )

    def update_subscription(
        self,
        topic_name: str,
        subscription: SubscriptionProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        """Apply the same settings to the subscription in both namespaces."""
        changed(
            "update_subscription",
            self._both("update_subscription", topic_name, subscription, **kwargs),
        )

    def delete_subscription(self, topic_name: str, subscription_name: str, **kwargs: Any) -> None:
        """Delete the subscription in both namespaces."""
        changed(
            "delete_subscription",
            self._both("delete_subscription", topic_name, subscription_name, **kwargs),
        )

    def list_subscriptions(self, topic_name: str, **kwargs: Any) -> list[SubscriptionProperties]:
        """Every subscription of either namespace, each annotated with the regions that have it."""
        return self._list("list_subscriptions", topic_name, **kwargs)

    def list_subscriptions_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> list[SubscriptionRuntimeProperties]:
        """Every subscription's runtime properties, each annotated with both regions'."""
        return self._list("list_subscriptions_runtime_properties", topic_name, **kwargs)

    def create_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> RuleProperties:
        """Create the rule in both namespaces."""
        return cast(
            RuleProperties,
            changed(
                "create_rule",
                self._both("create_rule", topic_name, subscription_name, rule_name, **kwargs),
            ),
        )

    def get_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> RuleProperties:
        """The rule's properties (the primary's), annotated with both regions'."""
        return cast(
            RuleProperties,
            read(
                "get_rule",
                self._both("get_rule", topic_name, subscription_name, rule_name, **kwargs),
            ),
        )

    def update_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule: RuleProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        """Apply the same rule to the subscription in both namespaces."""
        changed(
            "update_rule",
            self._both("update_rule", topic_name, subscription_name, rule, **kwargs),
        )

    def delete_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> None:
        """Delete the rule in both namespaces."""
        changed(
            "delete_rule",
            self._both("delete_rule", topic_name, subscription_name, rule_name, **kwargs),
        )

    def list_rules(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> list[RuleProperties]:
        """Every rule of the subscription in either namespace, annotated."""
        return self._list("list_rules", topic_name, subscription_name, **kwargs)

    def get_namespace_properties(self, **kwargs: Any) -> NamespaceProperties:
        """The primary namespace's properties, annotated with both."""
        return cast(
            NamespaceProperties,
            read("get_namespace_properties", self._both("get_namespace_properties", **kwargs)),
        )
