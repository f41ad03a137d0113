"""The SDK's management models, which both drop-in administration clients re-export (the
same classes: a georep client answers with them). ``georep.servicebus`` checked the extra
is installed before this module is imported."""

from __future__ import annotations

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
    "SqlRuleAction",
    "SqlRuleFilter",
    "SubscriptionProperties",
    "SubscriptionRuntimeProperties",
    "TopicProperties",
    "TopicRuntimeProperties",
    "TrueRuleFilter",
]

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
