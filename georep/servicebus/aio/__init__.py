"""The drop-in async ``ServiceBusClient`` over two regions: ``azure.servicebus.aio``'s API.

Change the line that makes the client; keep the rest::

    from georep.servicebus.aio import ServiceBusClient   # was: from azure.servicebus.aio ...

    client = ServiceBusClient.from_connection_strings(primary, secondary, seen=seen)
    async with client:
        async with client.get_queue_sender("orders") as sender:
            await sender.send_messages(ServiceBusMessage("hello"))

The SDK's message types, enums and ``AutoLockRenewer`` are re-exported, so the names a
module imported from ``azure.servicebus.aio`` (or ``azure.servicebus``) can come from here
too; importing them from the SDK, as before, works just as well. Install with
``pip install 'georep[servicebus]'``; see docs/migration.md for every method across two
regions.
"""

from __future__ import annotations

from azure.servicebus.aio import (
    AutoLockRenewer as AutoLockRenewer,
    ServiceBusSession as ServiceBusSession,
)

from georep._endpoint import NamespaceEndpoint as NamespaceEndpoint
from georep.servicebus._sdk_names import *  # noqa: F403 - the SDK's names, re-exported
from georep.servicebus._sdk_names import PACKAGE_NAMES, __all__ as _sdk_names

from ._client import ServiceBusClient as ServiceBusClient
from ._receiver import ServiceBusReceiver as ServiceBusReceiver
from ._sender import ServiceBusSender as ServiceBusSender

__all__ = [*_sdk_names, *PACKAGE_NAMES]
