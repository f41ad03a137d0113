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

__all__ = [
    "AsyncEmulatorTokenCredential",
    "Emulator",
    "EmulatorTokenCredential",
    "NamespaceControl",
    "SendRejection",
]

from typing import TYPE_CHECKING, Any

from georep._extras import import_on_first_use, require_extra

require_extra("georep.adapters.emulator", "emulator", "proton", "lark")

if TYPE_CHECKING:
    from ._emulator import Emulator, NamespaceControl, SendRejection
    from ._entra import AsyncEmulatorTokenCredential, EmulatorTokenCredential

# Imported on first use: the emulator's own process (``python -m georep.adapters.emulator``,
# started for every Emulator()) runs the server and needs none of the client side, which
# imports georep's errors and with them the azure-servicebus SDK.
_WHERE = {
    "AsyncEmulatorTokenCredential": "._entra",
    "Emulator": "._emulator",
    "EmulatorTokenCredential": "._entra",
    "NamespaceControl": "._emulator",
    "SendRejection": "._emulator",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return import_on_first_use(globals(), _WHERE[name], name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
