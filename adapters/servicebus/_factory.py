"""One place that picks the adapter for an azure-servicebus sender or receiver object."""

from __future__ import annotations

__all__ = ["region_receiver_for", "region_sender_for"]

from typing import Any, Final, NamedTuple

import azure.servicebus
import azure.servicebus.aio

from georep.exceptions import ConfigurationError
from georep.ports import RegionReceiver, RegionSender

from ._receiver import ServiceBusRegionReceiver
from ._sender import ServiceBusRegionSender
from ._sync import SyncServiceBusRegionReceiver, SyncServiceBusRegionSender


class _Adapters(NamedTuple):
    """The adapters of one SDK role: which SDK classes map to which adapter."""

    role: str
    port: type
    by_sdk_class: tuple[tuple[type, Any], ...]
    hint: str


_SENDER: Final = _Adapters(
    "sender",
    RegionSender,
    (
        (azure.servicebus.aio.ServiceBusSender, ServiceBusRegionSender),
        (azure.servicebus.ServiceBusSender, SyncServiceBusRegionSender),
    ),
    "(client.get_queue_sender(...) / get_topic_sender(...)) or a georep.ports.RegionSender",
)
_RECEIVER: Final = _Adapters(
    "receiver",
    RegionReceiver,
    (
        (azure.servicebus.aio.ServiceBusReceiver, ServiceBusRegionReceiver),
        (azure.servicebus.ServiceBusReceiver, SyncServiceBusRegionReceiver),
    ),
    "(client.get_queue_receiver(...) / get_subscription_receiver(...)) or a "
    "georep.ports.RegionReceiver",
)


def _adapter_for(adapters: _Adapters, sdk_object: Any, region: str) -> Any:
    """``sdk_object`` as a port: itself if it is one, else its adapter (async SDK objects
    run on the loop, sync ones on a worker thread each)."""
    if isinstance(sdk_object, adapters.port):
        return sdk_object
    for sdk_class, adapter in adapters.by_sdk_class:
        if isinstance(sdk_object, sdk_class):
            return adapter(sdk_object, region=region)
    role = adapters.role
    raise ConfigurationError(
        f"the {region} {role} is a {type(sdk_object).__name__}: pass an "
        f"azure.servicebus.ServiceBus{role.title()}, an "
        f"azure.servicebus.aio.ServiceBus{role.title()} {adapters.hint}"
    )


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
    sender: RegionSender = _adapter_for(_SENDER, sdk_sender, region)
    return sender


def region_receiver_for(sdk_receiver: Any, *, region: str) -> RegionReceiver:
    """The :class:`georep.ports.RegionReceiver` for an SDK receiver, async or sync.

    Args:
        sdk_receiver: The caller's peek-lock SDK receiver (georep never closes it).
        region: The region's label.

    Raises:
        ConfigurationError: ``sdk_receiver`` is none of the SDK receivers nor a
            RegionReceiver, or it is in RECEIVE_AND_DELETE mode.
    """
    receiver: RegionReceiver = _adapter_for(_RECEIVER, sdk_receiver, region)
    return receiver
