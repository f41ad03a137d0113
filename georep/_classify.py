"""The one table of what a failed operation says about its region (issue 14, item 6).

Every part of georep that asks "is this region unavailable?" reads :data:`CLASSIFICATION`:
the GeoSender's default failover kinds (and so what the outbox may queue), the paired
sender's failover timer, the syphon's retry-or-dead-letter decision, the relay channel's
default failover kinds, and :attr:`georep.exceptions.RegionError.retryable`. Two small sets
beside the table finish it: :data:`TRY_LATER_KINDS` (the outbox drainer) and
:data:`CLIENT_FAULT_KINDS` (the syphon). No other module defines a set of kinds. Adapters only
map their client's exceptions to an :class:`~georep.ports.ErrorKind`
(``georep.adapters.servicebus`` does it in one table of SDK classes); the error class raised
for a kind is :func:`georep.exceptions.region_error`'s choice (one class per kind, each
also the SDK's class for that failure).

This module is data about kinds (and :func:`every_region_refused`, the one rule that reads
a set of regions' answers with them): it imports only :mod:`georep.ports`, so
:mod:`georep.exceptions` can read it (imports run downward: ports, this table, the errors).

Decisions, and why:

- **Fail over only when the region may be unavailable**: the connection failed or was
  lost, no answer in time, or the namespace is throttling (``SERVER_BUSY``). A message sent
  to the other region after any other failure doubles traffic into it for a problem that
  is not an outage (a bug, a full queue, a wrong key) and hides the problem.
- **SERVER_BUSY fails over** (GeoSender). It was opt-in before. The SDK has already retried
  it with backoff (``retry_total``) by the time georep sees it, a throttled namespace did
  not store the message (so the copy in the other region is not a duplicate), and for the
  caller a namespace that keeps refusing is unavailable. Paired namespaces keep the old
  .NET behaviour (SPEC §3: "not auth, not server-busy") for their failover timer.
- **SERVICE_ERROR does not fail over.** It is any other ``ServiceBusError`` the service
  marked retryable (``amqp:internal-error`` and unknown conditions): the SDK has retried it
  already, and the service may have stored the message before failing, so a copy in the
  other region would be a duplicate. It is retryable (the same call may succeed later) and
  the syphon retries it, but it is raised to the caller at once, region unchanged. Add it
  to ``FailoverPolicy.fail_over_on`` to fail over on it anyway.
- The SDK's own ``retryable`` flag is not the rule: the SDK marks authentication,
  authorization and entity-disabled errors retryable, and every AMQP condition outside its
  short no-retry list (argument errors included). The adapter uses the flag only to split
  the generic ``ServiceBusError`` into SERVICE_ERROR (flag set) and INVALID_ARGUMENT (flag
  clear, or a failure inside the client such as a message id that is not valid UTF-8).
"""

from __future__ import annotations

__all__ = [
    "CLASSIFICATION",
    "CLIENT_FAULT_KINDS",
    "MESSAGE_FAULT_KINDS",
    "MISCONFIGURED_KINDS",
    "PAIRED_FAILOVER_KINDS",
    "RELAY_FAILOVER_KINDS",
    "RETRYABLE_KINDS",
    "TRY_LATER_KINDS",
    "UNAVAILABLE_KINDS",
    "Classification",
    "every_region_refused",
]

from collections.abc import Sequence
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from georep.ports import ErrorKind

_E = TypeVar("_E", bound=BaseException)


class Classification(NamedTuple):
    """What one :class:`~georep.ports.ErrorKind` means.

    Attributes:
        unavailable: The region may be down: a GeoSender fails over (and queues in the
            outbox when no region answers); the default for ``FailoverPolicy``.
        retryable: The same call may succeed later without any change (the syphon retries
            it; ``RegionError.retryable``).
        paired: Runs the paired sender's failover timer (SPEC §3).
    """

    unavailable: bool
    retryable: bool
    paired: bool


_C = Classification

#: The table. Every ErrorKind has a row (a unit test checks it).
CLASSIFICATION: MappingProxyType[ErrorKind, Classification] = MappingProxyType(
    {
        ErrorKind.CONNECTION: _C(True, True, True),
        ErrorKind.TIMEOUT: _C(True, True, True),
        ErrorKind.SERVER_BUSY: _C(True, True, False),
        ErrorKind.SERVICE_ERROR: _C(False, True, False),
        # A disabled entity in the primary: paired mode parks its messages in the backlog
        # until an operator enables it again (the syphon then moves them back).
        ErrorKind.ENTITY_DISABLED: _C(False, False, True),
        ErrorKind.ENTITY_NOT_FOUND: _C(False, False, False),
        ErrorKind.AUTHENTICATION: _C(False, False, False),
        ErrorKind.MESSAGE_TOO_LARGE: _C(False, False, False),
        ErrorKind.QUOTA_EXCEEDED: _C(False, False, False),
        ErrorKind.LOCK_LOST: _C(False, False, False),
        ErrorKind.INVALID_ARGUMENT: _C(False, False, False),
        ErrorKind.UNKNOWN: _C(False, False, False),
    }
)

UNAVAILABLE_KINDS: frozenset[ErrorKind] = frozenset(
    kind for kind, row in CLASSIFICATION.items() if row.unavailable
)
"""Kinds that mean "the region may be unavailable" (the GeoSender's default failover)."""

RETRYABLE_KINDS: frozenset[ErrorKind] = frozenset(
    kind for kind, row in CLASSIFICATION.items() if row.retryable
)
"""Kinds after which the same call may succeed later unchanged."""

PAIRED_FAILOVER_KINDS: frozenset[ErrorKind] = frozenset(
    kind for kind, row in CLASSIFICATION.items() if row.paired
)
"""Kinds that run the paired sender's failover timer."""

MESSAGE_FAULT_KINDS: frozenset[ErrorKind] = frozenset(
    {ErrorKind.MESSAGE_TOO_LARGE, ErrorKind.INVALID_ARGUMENT}
)
"""Kinds that are the message's (or request's) own fault: every region would refuse it."""

TRY_LATER_KINDS: frozenset[ErrorKind] = frozenset({ErrorKind.QUOTA_EXCEEDED})
"""Kinds that mean "try again later" without meaning the region is down (the entity is full
until receivers catch up). With :data:`RETRYABLE_KINDS` they make the outbox drainer retry
that one entry later, never dead-letter it, and never hold up the entries behind it."""

CLIENT_FAULT_KINDS: frozenset[ErrorKind] = frozenset({ErrorKind.AUTHENTICATION})
"""Kinds that mean a client is unusable (not an outage, not the message's fault): the
syphon closes that side's partner after ``partner_close_timeout`` (SPEC §3)."""

MISCONFIGURED_KINDS: frozenset[ErrorKind] = frozenset(
    {
        ErrorKind.AUTHENTICATION,
        ErrorKind.ENTITY_NOT_FOUND,
        ErrorKind.ENTITY_DISABLED,
        ErrorKind.INVALID_ARGUMENT,
    }
)
"""Kinds that mean the receiver's own settings are wrong for that namespace (key, entity
name, a receiver without a session on an entity that requires sessions): a pull receiver
whose every region answers one raises it to the application, as the SDK's receiver raises,
instead of waiting for messages that cannot come."""

RELAY_FAILOVER_KINDS: frozenset[ErrorKind] = UNAVAILABLE_KINDS | {
    ErrorKind.SERVICE_ERROR,
    ErrorKind.AUTHENTICATION,
    ErrorKind.ENTITY_NOT_FOUND,
}
"""The relay channel's default (SPEC §2.5). Relay kinds mean other things: SERVICE_ERROR is
a gateway answer (HTTP 502/503/504, handshake 500, close 1011), ENTITY_NOT_FOUND is "no
listener", AUTHENTICATION a refused handshake. The other endpoint lives in another
namespace with its own listener and key, and a relayed request carries no message that a
second try could duplicate in a queue, so each is worth one try there."""


def every_region_refused(answers: Sequence[_E | None]) -> _E | None:
    """The first region's answer, as a fresh exception to raise, when every region answered
    with a refusal of the client's own settings (a kind in :data:`MISCONFIGURED_KINDS`: its
    key, its entity, a receiver of the wrong kind); else None.

    The SDK's receiver raises its namespace's refusal; a drop-in receiver raises the
    primary's once both refused. The answers are kept (a region's last error), so the one
    raised is a copy: raising a kept exception again chains each caller's frames to it
    through its traceback for as long as it is kept, and shares one object (its
    ``__context__``, its traceback) between callers.

    Args:
        answers: Each region's last error (None: it answered), primary first.
    """
    if not answers or not all(
        answer is not None and getattr(answer, "kind", None) in MISCONFIGURED_KINDS
        for answer in answers
    ):
        return None
    first = answers[0]
    assert first is not None
    copy = type(first).__new__(type(first))  # not __init__: its arguments are the class's
    copy.args = first.args  # (set, not passed: OSError's __new__ ignores them then)
    copy.__dict__.update(first.__dict__)
    return copy
