"""Where georep meets the azure-servicebus SDK.

Install with ``pip install 'georep[servicebus]'``.
"""

from __future__ import annotations

__all__ = [
    "GeoMessageBatch",
    "ServiceBusCodec",
    "ServiceBusRegionReceiver",
    "ServiceBusRegionSender",
    "ServiceBusRegionSessions",
    "ServiceBusSessionReceiver",
    "SyncServiceBusRegionReceiver",
    "SyncServiceBusRegionSender",
    "ensure_backlog_queues",
    "from_backlog",
    "make_ping",
    "open_region_receiver",
    "open_region_sender",
    "open_region_sessions",
    "region_receiver_for",
    "region_sender_for",
    "to_backlog",
    "translate_error",
]

from georep._extras import require_extra

require_extra("georep.adapters.servicebus", "servicebus", "azure.servicebus")

from ._backlog import ensure_backlog_queues, from_backlog, make_ping, to_backlog
from ._codec import GeoMessageBatch, ServiceBusCodec
from ._errors import translate_error
from ._factory import region_receiver_for, region_sender_for
from ._receiver import ServiceBusRegionReceiver, open_region_receiver
from ._sender import ServiceBusRegionSender, open_region_sender
from ._sessions import ServiceBusRegionSessions, ServiceBusSessionReceiver, open_region_sessions
from ._sync import SyncServiceBusRegionReceiver, SyncServiceBusRegionSender
