"""georep: keep Azure Service Bus applications running through a regional outage."""

from __future__ import annotations

__version__ = "0.1.0"

from georep._ledger import ParquetLedger
from georep._outbox import SqliteOutbox
from georep._paired import PairedNamespaceOptions, backlog_queue_path
from georep._paired_sender import PairedSender
from georep._peek import peek_all
from georep._policy import (
    DEFAULT_FAILOVER_KINDS,
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
    AlreadySettledError,
    AuthenticationError,
    ClosedError,
    ConfigurationError,
    EmulatorError,
    EntityDisabledError,
    EntityNotFoundError,
    GeoReplicationError,
    InvalidArgumentError,
    InvalidMessageError,
    LockLostError,
    MessageExpiredError,
    MessageTooLargeError,
    OutboxFullError,
    OutboxUnavailableError,
    QuotaExceededError,
    RegionError,
    RegionTimeoutError,
    RegionUnavailableError,
    ServerBusyError,
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
    "AlreadySettledError",
    "AuthenticationError",
    "ClaimState",
    "ClosedError",
    "ConfigurationError",
    "DedupKey",
    "DrainPolicy",
    "EmulatorError",
    "EntityDisabledError",
    "EntityNotFoundError",
    "ErrorKind",
    "FailoverChannel",
    "FailoverPolicy",
    "GeoReceiver",
    "GeoReplicationError",
    "GeoSender",
    "InMemoryRoleStore",
    "InvalidArgumentError",
    "InvalidMessageError",
    "LockLostError",
    "MessageExpiredError",
    "MessageTooLargeError",
    "OutboxFullError",
    "OutboxUnavailableError",
    "PairedNamespaceOptions",
    "PairedSender",
    "ParquetLedger",
    "QuotaExceededError",
    "ReceiverHandler",
    "ReceiverStats",
    "RegionError",
    "RegionTimeoutError",
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
    "ServerBusyError",
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
