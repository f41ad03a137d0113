"""The drop-in ``ServiceBusAdministrationClient`` over two namespaces: every create,
update and delete applied to both, gets and lists that say where they differ. The SDK's
property and rule types are re-exported (importing them from
``azure.servicebus.management``, as before, works too)."""

from __future__ import annotations

from georep._extras import require_extra

require_extra("georep.servicebus", "servicebus", "azure.servicebus")

from azure.servicebus.management import (
    AccessRights,
    AuthorizationRule,
    CorrelationRuleFilter,
    EntityAvailabilityStatus,
    EntityStatus,
    FalseRuleFilter,
    MessageCountDetails,
    MessagingSku,
    NamespaceProperties,
    NamespaceType,
    QueueProperties,
    QueueRuntimeProperties,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
    TrueRuleFilter,
)

from ._client import ServiceBusAdministrationClient

__all__ = [
    "AccessRights",
    "AuthorizationRule",
    "CorrelationRuleFilter",
    "EntityAvailabilityStatus",
    "EntityStatus",
    "FalseRuleFilter",
    "MessageCountDetails",
    "MessagingSku",
    "NamespaceProperties",
    "NamespaceType",
    "QueueProperties",
    "QueueRuntimeProperties",
    "RuleProperties",
    "ServiceBusAdministrationClient",
    "SqlRuleAction",
    "SqlRuleFilter",
    "SubscriptionProperties",
    "SubscriptionRuntimeProperties",
    "TopicProperties",
    "TopicRuntimeProperties",
    "TrueRuleFilter",
]
