"""Errors raised by georep.

Every error georep raises derives from :class:`GeoReplicationError`, and is also the
azure-servicebus SDK's class for the same failure, or the builtin the SDK raises there
(issue 27): code written for the SDK keeps its ``except ServiceBusError:`` and
``except MessageSizeExceededError:`` blocks, and new code can catch georep's classes.

=============================== ===================================================
georep class                    also an instance of (``azure.servicebus.exceptions``)
=============================== ===================================================
``RegionError``                 ``ServiceBusError`` (kinds ``SERVICE_ERROR``, ``UNKNOWN``)
``RegionUnavailableError``      ``ServiceBusConnectionError``, ``ServiceBusCommunicationError``
                                (kind ``CONNECTION``)
``RegionTimeoutError``          ``OperationTimeoutError`` + those of ``RegionUnavailableError``
``ServerBusyError``             ``ServiceBusServerBusyError`` + those of ``RegionUnavailableError``
``AllRegionsUnavailableError``  ``ServiceBusConnectionError``, ``ServiceBusCommunicationError``
``MessageTooLargeError``        ``MessageSizeExceededError`` (a ``ValueError``)
``AuthenticationError``         ``PermissionError`` (the base of the next two)
``CredentialsRefusedError``     ``ServiceBusAuthenticationError`` (a wrong key or token)
``AccessDeniedError``           ``ServiceBusAuthorizationError`` (a key without the right)
``EntityNotFoundError``         ``MessagingEntityNotFoundError``, ``LookupError``
``EntityDisabledError``         ``MessagingEntityDisabledError`` + ``MessagingEntityNotFoundError``
``QuotaExceededError``          ``ServiceBusQuotaExceededError``
``LockLostError``               ``MessageLockLostError``, ``SessionLockLostError``
``InvalidArgumentError``        ``ServiceBusError``, ``ValueError``
``MessageNotFoundError``        ``MessageNotFoundError`` + those of ``InvalidArgumentError``
``OutboxFullError``             ``ServiceBusQuotaExceededError``
``OutboxUnavailableError``      ``ServiceBusError``
``StoreUnavailableError``       ``ServiceBusError``
``SettlementError``             ``ValueError`` (and ``RuntimeError``, as before)
``AlreadySettledError``         ``MessageAlreadySettled`` (a ``ValueError``)
``ClosedError``                 ``ValueError`` (and ``RuntimeError``, as before)
``InvalidMessageError``         ``ValueError``, ``TypeError``
``OversizeMessageError``        ``MessageSizeExceededError`` + those of ``InvalidMessageError``
``ConfigurationError``          ``ValueError``
``EmulatorError``               ``RuntimeError`` only: not a Service Bus operation
=============================== ===================================================

A :class:`RegionError`'s class follows its :class:`~georep.ports.ErrorKind`: build one with
:func:`region_error`, the one place that picks the class for a kind. When the SDK is not
installed the SDK names above are stand-ins (``georep._sdk_errors``).

Every error has georep's ``retryable`` and the SDK's attributes: ``message`` (the text),
``inner_exception`` (the cause), ``exc_type``/``exc_value``/``exc_traceback``/``exc_msg``
(from the cause) and ``_retryable`` (``retryable``). Its text never holds a key or SAS
signature (:func:`mask_secrets` masks any that reaches it).
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "AllRegionsUnavailableError",
    "AlreadySettledError",
    "AuthenticationError",
    "ClosedError",
    "ConfigurationError",
    "CredentialsRefusedError",
    "EmulatorError",
    "EntityDisabledError",
    "EntityNotFoundError",
    "ForkedProcessError",
    "GeoReplicationError",
    "InvalidArgumentError",
    "InvalidMessageError",
    "LockLostError",
    "MessageExpiredError",
    "MessageNotFoundError",
    "MessageTooLargeError",
    "OutboxFullError",
    "OutboxUnavailableError",
    "OversizeMessageError",
    "QuotaExceededError",
    "RegionError",
    "RegionTimeoutError",
    "RegionUnavailableError",
    "ServerBusyError",
    "SettlementError",
    "StoreUnavailableError",
    "error_type",
    "region_error",
]

from collections.abc import Mapping
from types import MappingProxyType, TracebackType
from typing import Any

from georep._classify import RETRYABLE_KINDS
from georep._sdk_errors import sdk
from georep._secrets import mask_secrets
from georep.ports import ErrorKind


def _rebuild(cls: type[GeoReplicationError], args: tuple[Any, ...]) -> GeoReplicationError:
    """Unpickle a georep error without its constructor (whose arguments it no longer has);
    the attributes come back through ``__setstate__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    return error


class GeoReplicationError(Exception):
    """Root of every georep error.

    Attributes:
        retryable: True when the same call may succeed later without any change.
        message: The error's text (the SDK's ``message``).
        inner_exception: The cause: the exception given to the constructor, else
            ``__cause__`` (the SDK's or the region's error it was raised ``from``).
    """

    retryable: bool = False
    # The rest of the SDK's ServiceBusError/AzureError surface, for code that reads it.
    continuation_token: str | None = None
    _shutdown_handler: bool = False
    _condition: str | None = None
    _status_code: int | None = None
    _inner: BaseException | None = None

    def __init__(self, message: str = "", *, inner_exception: BaseException | None = None) -> None:
        text = mask_secrets(str(message))
        # Exception's own constructor, not the SDK's (which takes keywords only and reads
        # sys.exc_info()): georep sets the SDK's attributes itself.
        Exception.__init__(self, text)
        self.message = text
        self._inner = inner_exception

    def _cause(self) -> BaseException | None:
        if self._inner is not None:
            return self._inner
        cause = self.__cause__
        return None if cause is self else cause

    @property
    def inner_exception(self) -> BaseException | None:
        """The cause (see the class docstring); None if there is none."""
        return self._cause()

    @inner_exception.setter
    def inner_exception(self, value: BaseException | None) -> None:
        self._inner = value

    # The SDK sets these four from sys.exc_info() when it builds an error; georep reads
    # them from the cause, unless code assigns them (as it may on the SDK's).

    @property
    def exc_type(self) -> type[Any] | None:
        """The cause's class (the SDK's ``exc_type``)."""
        if "exc_type" in self._assigned:
            return self._assigned["exc_type"]  # type: ignore[no-any-return]
        cause = self.inner_exception
        return None if cause is None else type(cause)

    @exc_type.setter
    def exc_type(self, value: type[Any] | None) -> None:
        self._assign("exc_type", value)

    @property
    def exc_value(self) -> BaseException | None:
        """The cause (the SDK's ``exc_value``)."""
        if "exc_value" in self._assigned:
            return self._assigned["exc_value"]  # type: ignore[no-any-return]
        return self.inner_exception

    @exc_value.setter
    def exc_value(self, value: BaseException | None) -> None:
        self._assign("exc_value", value)

    @property
    def exc_traceback(self) -> TracebackType | None:
        """The cause's traceback (the SDK's ``exc_traceback``)."""
        if "exc_traceback" in self._assigned:
            return self._assigned["exc_traceback"]  # type: ignore[no-any-return]
        cause = self.inner_exception
        return None if cause is None else cause.__traceback__

    @exc_traceback.setter
    def exc_traceback(self, value: TracebackType | None) -> None:
        self._assign("exc_traceback", value)

    @property
    def exc_msg(self) -> str:
        """``"{message}, {cause class}: {cause}"`` as the SDK formats it, secrets masked."""
        if "exc_msg" in self._assigned:
            return str(self._assigned["exc_msg"])
        cause = self.inner_exception
        return mask_secrets(f"{self.message}, {type(cause).__name__}: {cause}")

    @exc_msg.setter
    def exc_msg(self, value: str) -> None:
        self._assign("exc_msg", value)

    @property
    def _assigned(self) -> dict[str, Any]:
        return self.__dict__.get("_sdk_assigned", {})  # type: ignore[no-any-return]

    def _assign(self, name: str, value: Any) -> None:
        self.__dict__.setdefault("_sdk_assigned", {})[name] = value

    @property
    def _retryable(self) -> bool:
        # The SDK's private name for the same flag (its retry policy reads it).
        if "_retryable" in self._assigned:
            return bool(self._assigned["_retryable"])
        return self.retryable

    @_retryable.setter
    def _retryable(self, value: bool) -> None:
        self._assign("_retryable", value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's default pickling calls the class with self.args, which are not the
        # constructor's arguments here. The cause is left behind, as pickle leaves
        # __cause__ (an SDK exception does not unpickle).
        state = {
            key: value
            for key, value in vars(self).items()
            if key not in ("_inner", "_sdk_assigned")
        }
        return (_rebuild, (type(self), self.args), state)


class ConfigurationError(GeoReplicationError, ValueError):
    """A setting or argument is invalid; the message names it and the fix.

    Also a ``ValueError``, as the SDK raises for a bad setting.
    """


class EmulatorError(GeoReplicationError, RuntimeError):
    """The local Service Bus emulator failed to start, stopped, or refused a control call.

    A ``RuntimeError`` and no SDK class: controlling the emulator is not a Service Bus
    operation, and an application's ``except ServiceBusError`` must not hide a broken
    test fixture.
    """


class InvalidMessageError(GeoReplicationError, sdk.ServiceBusError, ValueError, TypeError):
    """A message (or the way it was passed) cannot be sent; the text says what to change.

    Also a ``ValueError``, a ``TypeError`` and the SDK's ``ServiceBusError``: the SDK raises
    the first for a bad field, the second for a message of the wrong type, and the third
    for an argument it fails to encode (a schedule time that is not a datetime, a sequence
    number that is not an int); georep raises this class for all three, so that whichever
    an application catches, it catches this.
    """


class OversizeMessageError(InvalidMessageError, sdk.MessageSizeExceededError):
    """A message, or the messages of one call, are over the entity's size limit, known
    before any call to a region: their bodies alone exceed the limit the regions announced,
    or a batch is full. Send fewer messages per call, or shrink them.

    Also the SDK's ``MessageSizeExceededError``, which the SDK raises in the same places
    (``ServiceBusMessageBatch.add_message`` on a full batch, ``send_messages`` over the
    link's limit). The limit a region enforces when it refuses a send is
    :class:`MessageTooLargeError`.
    """


class MessageExpiredError(InvalidMessageError):
    """The message's time to live ran out before georep could deliver it.

    georep never delivers a message after its original ``time_to_live``: one that expired
    while held (in a backlog queue, for the syphon) is dropped as expired (dead-lettered
    with reason ``TTLExpiredException`` and counted), not delivered late.
    """


class ClosedError(GeoReplicationError, RuntimeError, ValueError):
    """The object was closed; create a new one.

    Also a ``ValueError``, as the SDK raises for a handler used after it was shut down.
    """


class ForkedProcessError(ClosedError):
    """A georep object made before ``os.fork()`` was used in the forked child.

    Its connections belong to the parent and the threads it needs are not in the child:
    create the object in the child (gunicorn: in the app factory or a ``post_fork`` hook
    rather than with ``--preload``; Celery: ``worker_process_init``; multiprocessing: the
    ``spawn`` start method).
    """


class OutboxFullError(GeoReplicationError, sdk.ServiceBusQuotaExceededError):
    """The durable outbox reached its bound; the message was not stored and not sent.

    Raise the bound, or drain the backlog (restore a region) before sending more. Also the
    SDK's ``ServiceBusQuotaExceededError`` (a store is full until it is drained), but
    retryable: the same call succeeds once the backlog drains.
    """

    retryable = True


class SettlementError(GeoReplicationError, RuntimeError, ValueError):
    """A handler's settlement call was wrong: a message it was not given, or a second
    decision for one message. The text names the message's state and the fix.

    Also a ``ValueError``, as the SDK raises for a settlement it refuses before sending it
    (a peeked message, a receiver that was shut down); the cases the SDK raises
    ``MessageAlreadySettled`` for are :class:`AlreadySettledError`.
    """


class AlreadySettledError(SettlementError, sdk.MessageAlreadySettled):
    """The message was decided already, or is no longer being handled (its handler
    returned and georep settled it): the SDK's ``MessageAlreadySettled``."""


class OutboxUnavailableError(GeoReplicationError, sdk.ServiceBusError):
    """The outbox file could not be read or written just now (another process held its
    lock past the busy timeout, or an I/O error); nothing was stored by the failed call.

    Retry later; if it persists, check the file's disk and permissions.
    """

    retryable = True


class StoreUnavailableError(GeoReplicationError, sdk.ServiceBusError):
    """The seen-set store (Redis) could not be reached or did not answer in time.

    Receivers stop handing out messages while it lasts (nothing is processed unchecked)
    and resume when it answers again. A ``ServiceBusError``: the store holds what the
    service would (session state, the seen-set) for the calls that raise it.
    """

    retryable = True


class RegionError(GeoReplicationError, sdk.ServiceBusError):
    """An operation failed in one region.

    The class follows the kind (:func:`region_error`); this one is raised for
    ``SERVICE_ERROR`` and ``UNKNOWN`` and, like the SDK's plain ``ServiceBusError``, for
    a failure with no more specific class.

    Attributes:
        region: The region's label (``"primary"``, ``"secondary"``).
        kind: What the failure says about the region (see :class:`georep.ports.ErrorKind`).
        retryable: ``kind`` is one after which the same call may succeed later
            (``georep._classify.RETRYABLE_KINDS``).
    """

    def __init__(
        self,
        message: str,
        *,
        region: str,
        kind: ErrorKind,
        inner_exception: BaseException | None = None,
    ) -> None:
        super().__init__(message, inner_exception=inner_exception)
        self.region = region
        self.kind = kind

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self.kind in RETRYABLE_KINDS


class RegionUnavailableError(
    RegionError, sdk.ServiceBusConnectionError, sdk.ServiceBusCommunicationError
):
    """The region did not answer, or failed in a way that means it may be down.

    Connection failures (this class), timeouts (:class:`RegionTimeoutError`) and
    server-busy (:class:`ServerBusyError`); these fail over by default. Also the SDK's
    ``ServiceBusConnectionError`` and ``ServiceBusCommunicationError`` (kind ``CONNECTION``
    covers both: the connection failed, or could not be made).
    """


class RegionTimeoutError(RegionUnavailableError, sdk.OperationTimeoutError):
    """No answer within the deadline, the service's or georep's own (kind ``TIMEOUT``).

    Also the SDK's ``OperationTimeoutError`` and, as every
    :class:`RegionUnavailableError`, its ``ServiceBusConnectionError``.
    """


class ServerBusyError(RegionUnavailableError, sdk.ServiceBusServerBusyError):
    """The namespace is throttling requests (kind ``SERVER_BUSY``); fails over by default.

    Also the SDK's ``ServiceBusServerBusyError``.
    """


class MessageTooLargeError(RegionError, sdk.MessageSizeExceededError, ValueError):
    """The message or batch is over the entity's size limit; split it or shrink it.

    Also the SDK's ``MessageSizeExceededError`` (a ``ValueError``).
    """


class AuthenticationError(RegionError, PermissionError):
    """The region refused the credentials (:class:`CredentialsRefusedError`) or what they
    allow (:class:`AccessDeniedError`): kind ``AUTHENTICATION`` covers both. Catch this
    class for either; each of the two is also the SDK's class for its case, so an SDK
    program's ``except ServiceBusAuthenticationError`` and ``except
    ServiceBusAuthorizationError`` branches each get the one the SDK would raise there.
    """


class CredentialsRefusedError(AuthenticationError, sdk.ServiceBusAuthenticationError):
    """The region refused the key or token itself; check the key name and key for that
    namespace. Also the SDK's ``ServiceBusAuthenticationError``: the class of kind
    ``AUTHENTICATION`` (:func:`region_error`)."""


class AccessDeniedError(AuthenticationError, sdk.ServiceBusAuthorizationError):
    """The region took the key but it lacks the right the operation needs (``Send``,
    ``Listen``, ``Manage``); use a policy that has it. Also the SDK's
    ``ServiceBusAuthorizationError``."""


class EntityNotFoundError(RegionError, sdk.MessagingEntityNotFoundError, LookupError):
    """The queue or topic does not exist in that region; create it there.

    Also the SDK's ``MessagingEntityNotFoundError``.
    """


class EntityDisabledError(EntityNotFoundError, sdk.MessagingEntityDisabledError):
    """The queue or topic exists in that region but is disabled; enable it there.

    Also the SDK's ``MessagingEntityDisabledError``, and an :class:`EntityNotFoundError`
    (as before: the entity cannot be used there).
    """


class QuotaExceededError(RegionError, sdk.ServiceBusQuotaExceededError):
    """The entity or namespace is full; receive from it or raise its maximum size.

    Also the SDK's ``ServiceBusQuotaExceededError``.
    """


class LockLostError(RegionError, sdk.MessageLockLostError, sdk.SessionLockLostError):
    """A received copy's (or session's) lock expired before it was settled; it will be
    redelivered.

    Also the SDK's ``MessageLockLostError`` and ``SessionLockLostError`` (kind
    ``LOCK_LOST`` does not say which lock).
    """


class InvalidArgumentError(RegionError, ValueError):
    """The region refused the request itself (a bad property, an argument out of range, a
    message already settled there); fix the request: another region would refuse it too.

    Also a ``ServiceBusError`` and a ``ValueError``, as the SDK raises for these.
    """


class MessageNotFoundError(InvalidArgumentError, sdk.MessageNotFoundError):
    """The region has no message with that sequence number (``receive_deferred_messages``
    of a number it never deferred, or settled since): the SDK's ``MessageNotFoundError``.
    Kind ``INVALID_ARGUMENT``: asking again, or another region, finds nothing either."""


class AllRegionsUnavailableError(
    GeoReplicationError, sdk.ServiceBusConnectionError, sdk.ServiceBusCommunicationError
):
    """No region accepted the operation.

    Also the SDK's ``ServiceBusConnectionError`` and ``ServiceBusCommunicationError`` (what
    one namespace's outage raises), even when the regions timed out: each cause in
    ``causes`` has its own class.

    Attributes:
        causes: Each region's error, by region label, in the order they were tried.
        inner_exception: ``__cause__`` when raised ``from`` one, else the last cause.
    """

    retryable = True

    def __init__(
        self,
        message: str,
        causes: Mapping[str, BaseException],
        *,
        inner_exception: BaseException | None = None,
    ) -> None:
        detail = "; ".join(f"{region}: {cause}" for region, cause in causes.items())
        super().__init__(
            f"{message} ({detail})" if detail else message, inner_exception=inner_exception
        )
        self.causes = dict(causes)

    def _cause(self) -> BaseException | None:
        cause = super()._cause()
        return cause if cause is not None else next(reversed(self.causes.values()), None)


# The class raised for each kind. Every ErrorKind has one (a unit test checks it).
_ERROR_TYPES: Mapping[ErrorKind, type[RegionError]] = MappingProxyType(
    {
        ErrorKind.CONNECTION: RegionUnavailableError,
        ErrorKind.TIMEOUT: RegionTimeoutError,
        ErrorKind.SERVER_BUSY: ServerBusyError,
        ErrorKind.SERVICE_ERROR: RegionError,
        ErrorKind.QUOTA_EXCEEDED: QuotaExceededError,
        ErrorKind.AUTHENTICATION: CredentialsRefusedError,
        ErrorKind.ENTITY_NOT_FOUND: EntityNotFoundError,
        ErrorKind.ENTITY_DISABLED: EntityDisabledError,
        ErrorKind.MESSAGE_TOO_LARGE: MessageTooLargeError,
        ErrorKind.LOCK_LOST: LockLostError,
        ErrorKind.INVALID_ARGUMENT: InvalidArgumentError,
        ErrorKind.UNKNOWN: RegionError,
    }
)


def error_type(kind: ErrorKind) -> type[RegionError]:
    """The georep error class for a failure of ``kind`` (also the SDK's class for it)."""
    return _ERROR_TYPES[kind]


def region_error(
    message: str, *, region: str, kind: ErrorKind, inner_exception: BaseException | None = None
) -> RegionError:
    """The georep error for a failure of ``kind`` in ``region``: build every
    :class:`RegionError` with it (an adapter of your own too), so that its class says its
    kind to ``except`` blocks, georep's and the SDK's alike."""
    return _ERROR_TYPES[kind](message, region=region, kind=kind, inner_exception=inner_exception)
