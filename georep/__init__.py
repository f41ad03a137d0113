"""georep: keep Azure Service Bus applications running through a regional outage."""

from __future__ import annotations

__all__ = [
    "DEFAULT_FAILOVER_KINDS",
    "DEFAULT_RELAY_FAILOVER_KINDS",
    "ClaimState",
    "Corroboration",
    "DedupKey",
    "DrainPolicy",
    "ErrorKind",
    "FailoverChannel",
    "FailoverPolicy",
    "GeoReceiver",
    "GeoSender",
    "PairedNamespaceOptions",
    "PairedSender",
    "ParquetLedger",
    "ReceiverHandler",
    "ReceiverStats",
    "RelayChannelStats",
    "RelayPolicy",
    "RelayRequest",
    "RelayResponse",
    "ReplicationMode",
    "RoleRecord",
    "RoleState",
    "RoleStore",
    "SendResult",
    "SenderStats",
    "SqliteOutbox",
    "Syphon",
    "SyphonStats",
    "__version__",
    "backlog_queue_path",
    "receiver",
]

import importlib
import warnings
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from georep._extras import import_on_first_use
from georep._secrets import mask_log_secrets

mask_log_secrets()  # no key reaches a log line of georep's (an SDK error, a handler's)

if TYPE_CHECKING:
    from georep._policy import (
        DEFAULT_FAILOVER_KINDS,
        Corroboration,
        DedupKey,
        DrainPolicy,
        FailoverPolicy,
        ReplicationMode,
    )
    from georep.exceptions import *  # noqa: F403 (the errors: exceptions.__all__)
    from georep.ledger.parquet import ParquetLedger
    from georep.outbox.sqlite import SqliteOutbox
    from georep.paired.options import PairedNamespaceOptions, backlog_queue_path
    from georep.paired.sender import PairedSender
    from georep.paired.syphon import Syphon, SyphonStats
    from georep.ports import (
        ClaimState,
        ErrorKind,
        RelayRequest,
        RelayResponse,
        RoleRecord,
        RoleStore,
    )
    from georep.receive.receiver import GeoReceiver, ReceiverHandler, ReceiverStats, receiver
    from georep.relay.channel import (
        DEFAULT_RELAY_FAILOVER_KINDS,
        FailoverChannel,
        RelayChannelStats,
        RelayPolicy,
    )
    from georep.roles.state import RoleState
    from georep.send.sender import GeoSender, SenderStats, SendResult

_WHERE: dict[str, str] = {
    "AccessDeniedError": "georep.exceptions",
    "AllRegionsUnavailableError": "georep.exceptions",
    "AlreadySettledError": "georep.exceptions",
    "AuthenticationError": "georep.exceptions",
    "ClaimState": "georep.ports",
    "ClosedError": "georep.exceptions",
    "ConfigurationError": "georep.exceptions",
    "CredentialsRefusedError": "georep.exceptions",
    "Corroboration": "georep._policy",
    "DEFAULT_FAILOVER_KINDS": "georep._policy",
    "DEFAULT_RELAY_FAILOVER_KINDS": "georep.relay.channel",
    "DedupKey": "georep._policy",
    "DrainPolicy": "georep._policy",
    "EntityDisabledError": "georep.exceptions",
    "EntityNotFoundError": "georep.exceptions",
    "ErrorKind": "georep.ports",
    "FailoverChannel": "georep.relay.channel",
    "FailoverPolicy": "georep._policy",
    "ForkedProcessError": "georep.exceptions",
    "GeoReceiver": "georep.receive.receiver",
    "GeoReplicationError": "georep.exceptions",
    "GeoSender": "georep.send.sender",
    "InvalidArgumentError": "georep.exceptions",
    "InvalidMessageError": "georep.exceptions",
    "LockLostError": "georep.exceptions",
    "MessageExpiredError": "georep.exceptions",
    "MessageNotFoundError": "georep.exceptions",
    "MessageTooLargeError": "georep.exceptions",
    "OutboxFullError": "georep.exceptions",
    "OutboxUnavailableError": "georep.exceptions",
    "OversizeMessageError": "georep.exceptions",
    "PairedNamespaceOptions": "georep.paired.options",
    "PairedSender": "georep.paired.sender",
    "ParquetLedger": "georep.ledger.parquet",
    "QuotaExceededError": "georep.exceptions",
    "ReceiverHandler": "georep.receive.receiver",
    "ReceiverStats": "georep.receive.receiver",
    "RegionError": "georep.exceptions",
    "RegionTimeoutError": "georep.exceptions",
    "RegionUnavailableError": "georep.exceptions",
    "RelayChannelStats": "georep.relay.channel",
    "RelayPolicy": "georep.relay.channel",
    "RelayRequest": "georep.ports",
    "RelayResponse": "georep.ports",
    "ReplicationMode": "georep._policy",
    "RoleRecord": "georep.ports",
    "RoleState": "georep.roles.state",
    "RoleStore": "georep.ports",
    "SendResult": "georep.send.sender",
    "SenderStats": "georep.send.sender",
    "ServerBusyError": "georep.exceptions",
    "SettlementError": "georep.exceptions",
    "SqliteOutbox": "georep.outbox.sqlite",
    "StoreUnavailableError": "georep.exceptions",
    "Syphon": "georep.paired.syphon",
    "SyphonStats": "georep.paired.syphon",
    "backlog_queue_path": "georep.paired.options",
    "receiver": "georep.receive.receiver",
}

__all__ += [name for name, home in _WHERE.items() if home == "georep.exceptions"]

# Names that left the top level (test doubles and internals), for one release: each still
# resolves, with a DeprecationWarning naming its home.
_MOVED: dict[str, tuple[str, str]] = {
    "InMemoryRoleStore": ("georep.testing", "InMemoryRoleStore"),
    "EmulatorError": ("georep.exceptions", "EmulatorError"),
    "peek_all": ("georep.receive.peek", "peek_all"),
}

if not TYPE_CHECKING:  # type checkers see the imports above; old names are missing to them

    def __getattr__(name: str) -> Any:
        """A public name from its module, imported on first use: a process that needs
        one part of georep (the emulator, a CLI command, a Spark worker) does not pay for
        importing all of it."""
        if name in _WHERE:
            return import_on_first_use(globals(), _WHERE[name], name)
        if name not in _MOVED:
            raise AttributeError(f"module 'georep' has no attribute {name!r}")
        module, attribute = _MOVED[name]
        hint = (
            "use GeoReceiver.peek_all, or the SDK's peek_messages"
            if name == "peek_all"
            else f"import it from {module}"
        )
        warnings.warn(
            f"georep.{name} is no longer part of georep's public names and goes in the next "
            f"release: {hint}",
            DeprecationWarning,
            stacklevel=2,
        )
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # warned once (``from georep import x`` looks twice)
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
