"""The azure-servicebus names both drop-in packages re-export (:mod:`georep.servicebus`
and :mod:`georep.servicebus.aio`), so the other names a module imported from the SDK can
come from georep too; each package adds its own client, sender, receiver, session and
``AutoLockRenewer``."""

from __future__ import annotations

__all__ = [
    "NEXT_AVAILABLE_SESSION",
    "ClientOptions",
    "ReceiverArguments",
    "SenderArguments",
    "ServiceBusMessage",
    "ServiceBusMessageBatch",
    "ServiceBusMessageState",
    "ServiceBusReceiveMode",
    "ServiceBusReceivedMessage",
    "ServiceBusSessionFilter",
    "ServiceBusSubQueue",
    "TransportType",
]

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSessionFilter,
    ServiceBusSubQueue,
    TransportType,
)

from georep.servicebus._options import ClientOptions, ReceiverArguments, SenderArguments

# Each drop-in package defines these itself, over two regions (its __all__ adds them).
PACKAGE_NAMES = (
    "AutoLockRenewer",
    "NamespaceEndpoint",
    "ServiceBusClient",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
)
