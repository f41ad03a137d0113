"""In-memory fakes of georep's ports, for unit tests (yours and ours).

Nothing here does I/O or sleeps for real:

- :class:`FakeClock`: time moves only when the test calls :meth:`FakeClock.advance`.
- :class:`InMemoryRegionSender` with :class:`FakeMessage`/:class:`FakeCodec`: a region
  that accepts, fails with a chosen :class:`~georep.ports.ErrorKind`, or hangs.
- :class:`InMemoryOutbox`: the outbox contract without a file.
- :class:`InMemoryLedger`: the delivery ledger in lists.
- :class:`InMemoryRegionReceiver` and :class:`InMemorySeenSet`: a peek-lock queue and the
  seen-set, on the same fake clock; :class:`InMemoryRegionSessions`: a session-enabled
  queue for a GeoReceiver in session mode.
- :class:`InMemoryRelayEndpoint`: a relay endpoint served in-process, failing on demand.
- :class:`InMemoryRoleStore`: shared roles in memory (``unavailable = True`` fails them).
"""

from __future__ import annotations

__all__ = [
    "FakeBatch",
    "FakeClock",
    "FakeCodec",
    "FakeMessage",
    "FakeReceivedMessage",
    "InMemoryLedger",
    "InMemoryOutbox",
    "InMemoryRegionReceiver",
    "InMemoryRegionSender",
    "InMemoryRegionSessions",
    "InMemoryRelayEndpoint",
    "InMemoryRoleStore",
    "InMemorySeenSet",
    "InMemorySessionReceiver",
]

from georep.roles.store import InMemoryRoleStore
from georep.testing._clock import (
    FakeClock,
    settle as settle,  # tests wait for ready tasks with it
)
from georep.testing._ledger import InMemoryLedger
from georep.testing._messages import FakeBatch, FakeCodec, FakeMessage
from georep.testing._outbox import InMemoryOutbox
from georep.testing._regions import (
    FakeReceivedMessage,
    InMemoryRegionReceiver,
    InMemoryRegionSender,
)
from georep.testing._relay import InMemoryRelayEndpoint
from georep.testing._seen import InMemorySeenSet
from georep.testing._sessions import InMemoryRegionSessions, InMemorySessionReceiver
