"""georep: keep Azure Service Bus applications running through a regional outage."""

from __future__ import annotations

from pathlib import Path as _Path

__version__ = "0.1.0"

# Installed, georep.adapters lives inside this package (setuptools maps the top-level
# adapters/ folder there). Imported straight from a source checkout (the repository root on
# sys.path, e.g. `python -m pytest`), it is the sibling folder: let the import system find it.
_checkout_root = _Path(__file__).resolve().parent.parent
if (
    not (_Path(__file__).parent / "adapters").is_dir()
    and (_checkout_root / "adapters" / "__init__.py").is_file()
):
    __path__.append(str(_checkout_root))

from georep._ledger import ParquetLedger  # noqa: E402
from georep._outbox import SqliteOutbox  # noqa: E402
from georep._paired import PairedNamespaceOptions, backlog_queue_path  # noqa: E402
from georep._paired_sender import PairedSender  # noqa: E402
from georep._peek import peek_all  # noqa: E402
from georep._policy import (  # noqa: E402
    DEFAULT_FAILOVER_KINDS,
    DedupKey,
    DrainPolicy,
    FailoverPolicy,
    ReplicationMode,
)
from georep._receiver import GeoReceiver, ReceiverHandler, ReceiverStats, receiver  # noqa: E402
from georep._relay import (  # noqa: E402
    DEFAULT_RELAY_FAILOVER_KINDS,
    FailoverChannel,
    RelayChannelStats,
    RelayPolicy,
)
from georep._roles import RoleState  # noqa: E402
from georep._sender import GeoSender, SenderStats, SendResult  # noqa: E402
from georep._syphon import Syphon, SyphonStats  # noqa: E402
from georep.exceptions import (  # noqa: E402
    AllRegionsUnavailableError,
    AuthenticationError,
    ClosedError,
    ConfigurationError,
    EmulatorError,
    EntityNotFoundError,
    GeoReplicationError,
    InvalidMessageError,
    MessageExpiredError,
    MessageTooLargeError,
    OutboxFullError,
    OutboxUnavailableError,
    RegionError,
    RegionUnavailableError,
    SettlementError,
    StoreUnavailableError,
)
from georep.ports import ClaimState, ErrorKind, RelayRequest, RelayResponse  # noqa: E402

__all__ = [
    "DEFAULT_FAILOVER_KINDS",
    "DEFAULT_RELAY_FAILOVER_KINDS",
    "AllRegionsUnavailableError",
    "AuthenticationError",
    "ClaimState",
    "ClosedError",
    "ConfigurationError",
    "DedupKey",
    "DrainPolicy",
    "EmulatorError",
    "EntityNotFoundError",
    "ErrorKind",
    "FailoverChannel",
    "FailoverPolicy",
    "GeoReceiver",
    "GeoReplicationError",
    "GeoSender",
    "InvalidMessageError",
    "MessageExpiredError",
    "MessageTooLargeError",
    "OutboxFullError",
    "OutboxUnavailableError",
    "PairedNamespaceOptions",
    "PairedSender",
    "ParquetLedger",
    "ReceiverHandler",
    "ReceiverStats",
    "RegionError",
    "RegionUnavailableError",
    "RelayChannelStats",
    "RelayPolicy",
    "RelayRequest",
    "RelayResponse",
    "ReplicationMode",
    "RoleState",
    "SendResult",
    "SenderStats",
    "SettlementError",
    "SqliteOutbox",
    "StoreUnavailableError",
    "Syphon",
    "SyphonStats",
    "__version__",
    "backlog_queue_path",
    "peek_all",
    "receiver",
]
