"""georep: keep Azure Service Bus applications running through a regional outage."""

from __future__ import annotations

__version__ = "0.1.0"

from georep._fork import ForkedProcessError
from georep._ledger import ParquetLedger
from georep._outbox import SqliteOutbox
from georep._paired import PairedNamespaceOptions, backlog_queue_path
from georep._paired_sender import PairedSender
from georep._peek import peek_all
from georep._policy import (
    DEFAULT_FAILOVER_KINDS,
    Corroboration,
    DedupKey,
    DrainPolicy,
    FailoverPolicy,
    ReplicationMode,
)
from georep._receiver import GeoReceiver, ReceiverHandler, ReceiverStats, receiver
from georep._relay import (
    DEFAULT_RELAY_FAILOVER_KINDS,
    FailoverChannel,
    RelayChannelStats,
    RelayPolicy,
)
from georep._role_store import InMemoryRoleStore
from georep._roles import RoleState
from georep._sender import GeoSender, SenderStats, SendResult
from georep._syphon import Syphon, SyphonStats
from georep.exceptions import (
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
from georep.ports import (
    ClaimState,
    ErrorKind,
    RelayRequest,
    RelayResponse,
    RoleRecord,
    RoleStore,
)

__all__ = [
    "DEFAULT_FAILOVER_KINDS",
    "DEFAULT_RELAY_FAILOVER_KINDS",
    "AllRegionsUnavailableError",
    "AuthenticationError",
    "ClaimState",
    "ClosedError",
    "ConfigurationError",
    "Corroboration",
    "DedupKey",
    "DrainPolicy",
    "EmulatorError",
    "EntityNotFoundError",
    "ErrorKind",
    "FailoverChannel",
    "FailoverPolicy",
    "ForkedProcessError",
    "GeoReceiver",
    "GeoReplicationError",
    "GeoSender",
    "InMemoryRoleStore",
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
    "RoleRecord",
    "RoleState",
    "RoleStore",
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
