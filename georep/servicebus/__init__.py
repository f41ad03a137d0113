"""The drop-in ``ServiceBusClient`` over two regions: ``azure.servicebus``'s API.

Change the line that makes the client; keep the rest::

    from georep.servicebus import ServiceBusClient   # was: from azure.servicebus import ...

    with ServiceBusClient.from_connection_strings(primary, secondary, seen=seen) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("hello"))

The blocking client drives :mod:`georep.servicebus.aio`'s on georep's one event-loop
thread (as :mod:`georep.sync` does). The SDK's message types, enums and ``AutoLockRenewer``
are re-exported, so a module's other ``azure.servicebus`` names can come from here too;
importing them from the SDK, as before, works just as well. See docs/migration.md.
"""

from __future__ import annotations

from georep._extras import require_extra

require_extra("georep.servicebus", "servicebus", "azure.servicebus")

from azure.servicebus import (
    AutoLockRenewer as AutoLockRenewer,
    ServiceBusSession as ServiceBusSession,
    parse_connection_string as parse_connection_string,
)

from georep._endpoint import NamespaceEndpoint as NamespaceEndpoint
from georep.servicebus._sdk_names import *  # noqa: F403 - the SDK's names, re-exported
from georep.servicebus._sdk_names import PACKAGE_NAMES, __all__ as _sdk_names

from ._sync import (
    ServiceBusClient as ServiceBusClient,
    ServiceBusReceiver as ServiceBusReceiver,
    ServiceBusSender as ServiceBusSender,
)

__all__ = [*_sdk_names, *PACKAGE_NAMES, "parse_connection_string"]
