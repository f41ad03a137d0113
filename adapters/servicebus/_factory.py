"""One place that picks the adapter for an azure-servicebus sender or receiver object."""

from __future__ import annotations

from typing import Any

import azure.servicebus
import azure.servicebus.aio

from georep.exceptions import ConfigurationError
from georep.ports import RegionReceiver, RegionSender

from ._receiver import ServiceBusRegionReceiver
from ._sender import ServiceBusRegionSender
from ._sync import SyncServiceBusRegionReceiver, SyncServiceBusRegionSender

__all__ = ["region_receiver_for", "region_sender_for"]


def region_sender_for(sdk_sender: Any, *, region: str) -> RegionSender:
    """The :class:`georep.ports.RegionSender` for an SDK sender, async or sync.

    ``azure.servicebus.aio.ServiceBusSender`` calls run on the event loop;
    ``azure.servicebus.ServiceBusSender`` (sync) calls run on one worker thread per SDK
    sender (:class:`SyncServiceBusRegionSender`). A RegionSender is returned as it is.

    Args:
        sdk_sender: The caller's SDK sender (georep never closes it).
        region: The region's label (``"primary"``).

    Raises:
        ConfigurationError: ``sdk_sender`` is none of these.
    """
    if isinstance(sdk_sender, RegionSender):
        return sdk_sender
    if isinstance(sdk_sender, azure.servicebus.aio.ServiceBusSender):
        return ServiceBusRegionSender(sdk_sender, region=region)
    if isinstance(sdk_sender, azure.servicebus.ServiceBusSender):
        return SyncServiceBusRegionSender(sdk_sender, region=region)
    raise ConfigurationError(
        f"the {region} sender is a {type(sdk_sender).__name__}: pass an "
        "azure.servicebus.ServiceBusSender, an azure.servicebus.aio.ServiceBusSender "
        "(client.get_queue_sender(...) / get_topic_sender(...)) or a georep.ports.RegionSender"
    )


def region_receiver_for(sdk_receiver: Any, *, region: str) -> RegionReceiver:
    """The :class:`georep.ports.RegionReceiver` for an SDK receiver, async or sync.

    Args:
        sdk_receiver: The caller's peek-lock SDK receiver (georep never closes it).
        region: The region's label.

    Raises:
        ConfigurationError: ``sdk_receiver`` is none of the SDK receivers nor a
            RegionReceiver, or it is in RECEIVE_AND_DELETE mode.
    """
    if isinstance(sdk_receiver, RegionReceiver):
        return sdk_receiver
    if isinstance(sdk_receiver, azure.servicebus.aio.ServiceBusReceiver):
        return ServiceBusRegionReceiver(sdk_receiver, region=region)
    if isinstance(sdk_receiver, azure.servicebus.ServiceBusReceiver):
        return SyncServiceBusRegionReceiver(sdk_receiver, region=region)
    raise ConfigurationError(
        f"the {region} receiver is a {type(sdk_receiver).__name__}: pass an "
        "azure.servicebus.ServiceBusReceiver, an azure.servicebus.aio.ServiceBusReceiver "
        "(client.get_queue_receiver(...) / get_subscription_receiver(...)) or a "
        "georep.ports.RegionReceiver"
    )
