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

try:
    import proton  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "georep.adapters.emulator needs python-qpid-proton: pip install 'georep[emulator]'"
    ) from exc

from ._emulator import Emulator, NamespaceControl, SendRejection

__all__ = ["Emulator", "NamespaceControl", "SendRejection"]
