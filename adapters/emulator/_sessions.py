"""Service Bus sessions for the emulator's broker: session locks, FIFO per session, state.

A session-enabled queue or subscription (``requires_session=True``; never its dead-letter
queue) keeps its available messages per session id instead of in one deque. A receiver
link holds at most one session, exclusively: it locks a named session, or the next
session that has messages and no holder. The lock lasts the entity's ``lock_duration``
and is renewed with ``com.microsoft:renew-session-lock``; messages delivered through it
are locked for exactly as long as the session is. When the lock expires, or the link or
its connection closes, the session is free again and its unsettled messages return to
the head of the session, in order (each counts one more delivery).

Like :mod:`._broker`, nothing here does I/O or reads the wall clock: the AMQP layer
implements :class:`SessionHolder` and :class:`SessionWaiter`, and deadlines go through
the namespace's timer heap. The broker's entity, which makes and calls :class:`Sessions`,
is seen here as a :class:`SessionEntity`: this module sits below ``_broker``.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_ACCEPT_TIMEOUT",
    "SESSION_CANNOT_BE_LOCKED",
    "SESSION_LOCK_LOST",
    "Session",
    "SessionEntity",
    "SessionHolder",
    "SessionWaiter",
    "Sessions",
]

import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol

from ._errors import BrokerError
from ._message import MessageState, StoredMessage

if TYPE_CHECKING:
    import uuid

SESSION_LOCK_LOST: Final = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED: Final = "com.microsoft:session-cannot-be-locked"
#: How long a next-available receiver waits for a session when it sends no
#: ``com.microsoft:timeout`` (seconds; the service's default operation timeout).
DEFAULT_ACCEPT_TIMEOUT: Final = 60.0

# Timer kinds of Sessions on the namespace heap.
LOCK_EXPIRY, ACCEPT_TIMEOUT = 10, 11


class SessionHolder(Protocol):
    """A receiver link that holds one session (implemented by the AMQP layer)."""

    receive_and_delete: bool

    @property
    def credit(self) -> int:
        """How many more messages the link may take now."""

    def deliver(self, message: StoredMessage, lock_token: uuid.UUID | None) -> None:
        """Transfer ``message`` (already locked or removed by the broker)."""

    def session_lost(self, error: BrokerError) -> None:
        """The session's lock is gone: detach the link with ``error``."""


class SessionWaiter(Protocol):
    """A next-available receiver whose attach waits for a session."""

    @property
    def holder(self) -> SessionHolder:
        """The link that will hold the session."""

    def accepted(self, session: Session) -> None:
        """``session`` is now locked for :attr:`holder`: open the link naming it."""

    def timed_out(self) -> None:
        """No session became available in time: refuse the link."""


class SessionTimers(Protocol):
    """The namespace as sessions use it: its clock and its timer heap."""

    @property
    def clock(self) -> Callable[[], float]:
        """Seconds since the epoch (injected in tests)."""

    def add_timer(self, deadline: float, kind: int, target: Sessions, payload: Any) -> None:
        """Call ``target.on_timer(kind, payload, now)`` at ``deadline``."""


class LockSettings(Protocol):
    """The entity property sessions read."""

    @property
    def lock_duration(self) -> timedelta:
        """How long a session lock lasts before it is renewed."""


class SessionEntity(Protocol):
    """A session-enabled queue or subscription as its sessions see it (the broker's
    ``Entity``, which keeps the messages, their locks and the dead-letter queue)."""

    @property
    def namespace(self) -> SessionTimers:
        """The namespace the entity belongs to."""

    @property
    def properties(self) -> LockSettings:
        """The entity's settings."""

    @property
    def fragments_down(self) -> set[int]:
        """Fragments of a partitioned entity that are down (their messages wait)."""

    @property
    def by_sequence(self) -> Mapping[int, StoredMessage]:
        """Every message the entity holds, by sequence number."""

    def expire(self, message: StoredMessage) -> None:
        """``message`` outlived its time to live: dead-letter it when the entity says so,
        else drop it."""

    def hand_over(self, consumer: SessionHolder, message: StoredMessage, now: float) -> None:
        """Deliver ``message``: removed (receive-and-delete) or locked (peek-lock)."""

    def session_ended(self, message: StoredMessage) -> None:
        """``message`` was locked under a session lock that ended: it returns."""


class Session:
    """One session id of one entity: its available messages, lock and state."""

    __slots__ = (
        "holder",
        "locked",
        "locked_until",
        "messages",
        "session_id",
        "state",
        "state_updated_at",
    )

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.messages: deque[StoredMessage] = deque()
        """Available messages, oldest first (lazily skips ones no longer available)."""
        self.holder: SessionHolder | None = None
        self.locked_until = 0.0
        self.locked: set[StoredMessage] = set()
        """Messages delivered in peek-lock mode under this lock and not yet settled."""
        self.state: bytes | None = None
        self.state_updated_at: float | None = None

    def head(self) -> StoredMessage | None:
        """The first message still available, dropping settled ones from the front."""
        messages = self.messages
        while messages and messages[0].state is not MessageState.AVAILABLE:
            messages.popleft()
        return messages[0] if messages else None


def _return_in_order(messages: deque[StoredMessage], message: StoredMessage) -> None:
    """Put a returning message (abandoned, released) back before every later one.

    A session is delivered in sequence-number order on Service Bus however many of its
    messages return, and in whatever order they are abandoned (one by one in ascending
    order, as a receiver that closes with several in hand does): always to the head would
    reverse them.
    """
    number = message.sequence_number
    for index, queued in enumerate(messages):
        if queued.sequence_number > number:
            messages.insert(index, message)
            return
    messages.append(message)


class Sessions:
    """The sessions of one session-enabled entity."""

    def __init__(self, entity: SessionEntity) -> None:
        self.entity = entity
        self.by_id: dict[str, Session] = {}
        self._held: dict[SessionHolder, Session] = {}
        self._waiters: deque[SessionWaiter] = deque()
        self._returning = False  # while a lock's messages return: offer them only after

    # -- messages -------------------------------------------------------------------
    def add(self, message: StoredMessage, *, front: bool = False) -> None:
        """An available message (new, released or due) joins its session."""
        assert message.session_id is not None  # the broker refuses others
        session = self._session(message.session_id)
        if front:
            _return_in_order(session.messages, message)
        else:
            session.messages.append(message)
        if not self._returning:
            self._offer(session)

    def _session(self, session_id: str) -> Session:
        session = self.by_id.get(session_id)
        if session is None:
            session = self.by_id[session_id] = Session(session_id)
        return session

    def dispatch(self) -> None:
        """Deliver to every holder with credit (a credit grant, a fragment back up)."""
        for session in list(self._held.values()):
            self._deliver(session)

    def _offer(self, session: Session) -> None:
        if session.holder is not None:
            self._deliver(session)
        elif self._waiters and self._has_ready(session):
            self._hand_to_waiter(session)

    def _deliver(self, session: Session) -> None:
        holder = session.holder
        if holder is None:
            return
        entity = self.entity
        now = entity.namespace.clock()
        while holder.credit > 0:
            message = session.head()
            if message is None:
                return
            if message.fragment is not None and message.fragment in entity.fragments_down:
                return  # the session's fragment is down: its messages wait, in order
            session.messages.popleft()
            if message.expires_at is not None and message.expires_at <= now:
                entity.expire(message)
                continue
            entity.hand_over(holder, message, now)

    def _has_ready(self, session: Session) -> bool:
        head = session.head()
        return head is not None and (
            head.fragment is None or head.fragment not in self.entity.fragments_down
        )

    # -- accepting --------------------------------------------------------------------
    def accept(self, waiter: SessionWaiter, session_id: str) -> Session:
        """Lock ``session_id`` for ``waiter`` (a receiver naming its session).

        Raises:
            BrokerError: ``com.microsoft:session-cannot-be-locked`` when another receiver
                holds it (SDK: ``SessionCannotBeLockedError``).
        """
        session = self._session(session_id)
        if session.holder is not None:
            raise BrokerError(
                SESSION_CANNOT_BE_LOCKED,
                f"The requested session '{session_id}' cannot be accepted. It may be locked "
                "by another receiver. Close that receiver, or wait for its lock to expire.",
            )
        self._lock(session, waiter)
        return session

    def accept_next(self, waiter: SessionWaiter, timeout: float) -> bool:
        """Lock the next free session with messages for ``waiter``, now or within
        ``timeout`` seconds; True when it got one at once. Otherwise ``waiter`` hears
        ``accepted`` or ``timed_out`` later (or is withdrawn with :meth:`withdraw`)."""
        ready = [s for s in self.by_id.values() if s.holder is None and self._has_ready(s)]
        if ready:
            # The session whose oldest message is oldest, so no session starves.
            oldest = min(ready, key=lambda s: s.head().sequence_number)  # type: ignore[union-attr]
            self._lock(oldest, waiter)
            return True
        self._waiters.append(waiter)
        namespace = self.entity.namespace
        namespace.add_timer(namespace.clock() + timeout, ACCEPT_TIMEOUT, self, waiter)
        return False

    def withdraw(self, waiter: SessionWaiter) -> None:
        """Forget a waiting receiver (its link or connection closed)."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _hand_to_waiter(self, session: Session) -> None:
        self._lock(session, self._waiters.popleft())

    def _lock(self, session: Session, waiter: SessionWaiter) -> None:
        holder = waiter.holder
        session.holder = holder
        self._held[holder] = session
        self._extend(session)
        waiter.accepted(session)
        self._deliver(session)

    def _extend(self, session: Session) -> float:
        namespace = self.entity.namespace
        session.locked_until = (
            namespace.clock() + self.entity.properties.lock_duration.total_seconds()
        )
        for message in session.locked:
            message.locked_until = session.locked_until
        namespace.add_timer(session.locked_until, LOCK_EXPIRY, self, session)
        return session.locked_until

    # -- the lock ---------------------------------------------------------------------
    def lock_message(self, message: StoredMessage) -> float:
        """A message delivered in peek-lock mode: locked for as long as its session."""
        session = self.by_id[message.session_id]  # type: ignore[index]
        session.locked.add(message)
        return session.locked_until

    def forget(self, message: StoredMessage) -> None:
        """A message left the locked state (settled, released, moved)."""
        if message.session_id is not None:
            session = self.by_id.get(message.session_id)
            if session is not None:
                session.locked.discard(message)

    def check_lock(self, message: StoredMessage | None) -> None:
        """Settling ``message`` (None: its lock token is unknown) needs its session's lock
        to be held and unexpired.

        Raises:
            BrokerError: ``com.microsoft:session-lock-lost`` (SDK: ``SessionLockLostError``).
        """
        session_id = message.session_id if message is not None else None
        session = self.by_id.get(session_id or "")
        if (
            message is None
            or session is None
            or message not in session.locked
            or not self._valid(session)
        ):
            raise _lock_lost(session_id)

    def _valid(self, session: Session) -> bool:
        return session.holder is not None and session.locked_until > self.entity.namespace.clock()

    def held(self, session_id: str, holder: SessionHolder | None) -> Session:
        """The session ``holder`` holds (for management operations on it).

        Raises:
            BrokerError: ``com.microsoft:session-lock-lost``: not held by ``holder`` (its
                lock expired or was released, or the request came from another link).
        """
        session = self.by_id.get(session_id)
        if session is None or holder is None or session.holder is not holder:
            raise _lock_lost(session_id)
        if not self._valid(session):
            self._lose(session)
            raise _lock_lost(session_id)
        return session

    def renew(self, session_id: str, holder: SessionHolder | None) -> float:
        """Extend the session lock by the entity's lock duration; the new expiry."""
        return self._extend(self.held(session_id, holder))

    def release(self, holder: SessionHolder) -> None:
        """``holder``'s link or connection closed: its session is free again."""
        session = self._held.pop(holder, None)
        if session is not None and session.holder is holder:
            self._unlock(session)

    def expire_locks(self) -> int:
        """Fault injection: every held session loses its lock now; how many did."""
        sessions = list(self._held.values())
        for session in sessions:
            self._lose(session)
        return len(sessions)

    def _lose(self, session: Session) -> None:
        holder = session.holder
        if holder is None:
            return
        self._held.pop(holder, None)
        self._unlock(session)
        holder.session_lost(_lock_lost(session.session_id))

    def _unlock(self, session: Session) -> None:
        session.holder = None
        session.locked_until = 0.0
        # Unsettled messages return to the head, oldest first (each counts a delivery).
        self._returning = True
        try:
            for message in sorted(session.locked, key=lambda m: m.sequence_number, reverse=True):
                self.entity.session_ended(message)
        finally:
            self._returning = False
        session.locked.clear()
        if self._waiters and self._has_ready(session):
            self._hand_to_waiter(session)
        self._drop_if_empty(session)

    def _drop_if_empty(self, session: Session) -> None:
        # Nothing to keep: a later message recreates it, and a deferred one is received
        # only by a receiver that accepted (so recreated) its session.
        if (
            session.holder is None
            and session.state is None
            and not session.locked
            and session.head() is None
        ):
            self.by_id.pop(session.session_id, None)

    # -- timers -----------------------------------------------------------------------
    def on_timer(self, kind: int, payload: Any, now: float) -> None:
        if kind == LOCK_EXPIRY:
            session: Session = payload
            if session.holder is not None and session.locked_until <= now:
                self._lose(session)
        elif kind == ACCEPT_TIMEOUT and payload in self._waiters:
            self._waiters.remove(payload)
            payload.timed_out()

    # -- state and listing --------------------------------------------------------------
    def get_state(self, session_id: str, holder: SessionHolder | None) -> bytes | None:
        return self.held(session_id, holder).state

    def set_state(self, session_id: str, holder: SessionHolder | None, state: bytes | None) -> None:
        """Store (or with None clear) the session's state; it outlives the lock."""
        session = self.held(session_id, holder)
        session.state = bytes(state) if state is not None else None
        session.state_updated_at = self.entity.namespace.clock()

    def list(self, updated_since: float | None, skip: int, top: int) -> list[str]:
        """Session ids, as ``com.microsoft:get-message-sessions`` answers.

        Without ``updated_since``: sessions with active messages or a stored state.
        With it: sessions whose state was set after that time (seconds since the epoch).
        """
        if updated_since is None:
            active = {m.session_id for m in self._active() if m.session_id is not None}
            ids = active | {s.session_id for s in self.by_id.values() if s.state is not None}
        else:
            ids = {
                s.session_id
                for s in self.by_id.values()
                if s.state_updated_at is not None and s.state_updated_at > updated_since
            }
        return sorted(ids)[skip : skip + top]

    def _active(self) -> Iterator[StoredMessage]:
        """Active messages (any state but scheduled), as the listing counts them."""
        for message in self.entity.by_sequence.values():
            if message.state is not MessageState.SCHEDULED:
                yield message

    def clear(self) -> None:
        """Every message is gone (a disaster): forget sessions, locks and state."""
        for session in list(self._held.values()):
            session.locked.clear()
            self._lose(session)
        self.by_id.clear()


def _lock_lost(session_id: str | None) -> BrokerError:
    which = f"on '{session_id}' " if session_id is not None else ""
    return BrokerError(
        SESSION_LOCK_LOST,
        f"The session lock {which}was lost: it expired or the session was released (its "
        "receiver closed). Accept the session again with a new receiver.",
    )
