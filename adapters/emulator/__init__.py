"""A local multi-region Azure Service Bus emulator with fault injection.

The unmodified ``azure-servicebus`` SDK (sync and async) talks to it over AMQP 1.0 with
real SAS authentication; ``ServiceBusAdministrationClient`` works over HTTPS on the same
port. Install with ``pip install 'georep[emulator]'``.

Example::

    from georep.adapters.emulator import Emulator

    async with Emulator(namespaces=("primary", "secondary"), queues=("orders",)) as emu:
        primary = emu.connection_string("primary")
        emu.namespace("primary").outage()
"""

from __future__ import annotations

from georep._extras import require_extra

require_extra("georep.adapters.emulator", "emulator", "proton", "lark")

from ._emulator import Emulator, NamespaceControl, SendRejection
from ._entra import AsyncEmulatorTokenCredential, EmulatorTokenCredential

__all__ = [
    "AsyncEmulatorTokenCredential",
    "Emulator",
    "EmulatorTokenCredential",
    "NamespaceControl",
    "SendRejection",
]
