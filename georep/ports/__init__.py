"""The ports georep's core depends on; adapters implement them.

The core (``georep``) never imports a network client. It talks to Service Bus through
:class:`RegionSender` and :class:`MessageCodec`, persists unsent messages through
:class:`Outbox`, and reads time through :class:`Clock`. ``georep.adapters.servicebus``
implements the Service Bus ports on the azure-servicebus SDK; :class:`georep.SqliteOutbox`
is the embedded outbox; ``georep.testing`` has in-memory fakes of every port for unit tests.

One module per concern: clock, codec, ledger, regions, relay, stores."""

__all__ = [
    "FINAL_STATES",
    "NO_RECORD",
    "ClaimState",
    "Claims",
    "Clock",
    "Delivery",
    "ErrorKind",
    "Ledger",
    "MessageCodec",
    "OrderStamp",
    "Outbox",
    "OutboxEntry",
    "OutboxItems",
    "OutboxSessions",
    "ReceiveRecord",
    "RegionAttempt",
    "RegionIdentity",
    "RegionReceiver",
    "RegionSender",
    "RegionSessions",
    "RegionSlot",
    "RelayEndpoint",
    "RelayRequest",
    "RelayResponse",
    "RoleChangeTerms",
    "RoleRecord",
    "RoleStore",
    "ScheduleStore",
    "SeenStore",
    "SendRecord",
    "SessionReceiver",
    "SessionStateStore",
]

from georep._slot import RegionSlot
from georep.ports.clock import Clock
from georep.ports.codec import MessageCodec
from georep.ports.ledger import Ledger, ReceiveRecord, RegionAttempt, SendRecord
from georep.ports.regions import (
    Delivery,
    ErrorKind,
    OrderStamp,
    RegionIdentity,
    RegionReceiver,
    RegionSender,
    RegionSessions,
    SessionReceiver,
)
from georep.ports.relay import RelayEndpoint, RelayRequest, RelayResponse
from georep.ports.stores import (
    FINAL_STATES,
    NO_RECORD,
    Claims,
    ClaimState,
    Outbox,
    OutboxEntry,
    OutboxItems,
    OutboxSessions,
    RoleChangeTerms,
    RoleRecord,
    RoleStore,
    ScheduleStore,
    SeenStore,
    SessionStateStore,
)
