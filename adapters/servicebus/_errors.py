"""The one place azure-servicebus exceptions become georep errors.

:data:`SDK_ERROR_KINDS` maps each SDK exception class to an :class:`ErrorKind`; what a kind
means (fail over or not, retryable or not) is decided in one table in the core,
``georep._classify.CLASSIFICATION``, and the georep class raised for it (which is also the
SDK's class for that failure) by ``georep.exceptions.region_error``.
"""

from __future__ import annotations

__all__ = ["SDK_ERROR_KINDS", "error_kind", "translate_error"]

from azure.servicebus.exceptions import (
    AutoLockRenewFailed,
    AutoLockRenewTimeout,
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from georep import exceptions as georep_errors
from georep.exceptions import GeoReplicationError, RegionError, region_error
from georep.ports import ErrorKind

#: Every exception class of ``azure.servicebus.exceptions``, most specific first (the first
#: ``isinstance`` match wins). The plain ``ServiceBusError`` is decided by :func:`error_kind`.
SDK_ERROR_KINDS: tuple[tuple[type[BaseException], ErrorKind], ...] = (
    (MessageSizeExceededError, ErrorKind.MESSAGE_TOO_LARGE),
    (ServiceBusAuthenticationError, ErrorKind.AUTHENTICATION),
    (ServiceBusAuthorizationError, ErrorKind.AUTHENTICATION),
    (MessagingEntityNotFoundError, ErrorKind.ENTITY_NOT_FOUND),
    (MessagingEntityDisabledError, ErrorKind.ENTITY_DISABLED),
    (MessagingEntityAlreadyExistsError, ErrorKind.INVALID_ARGUMENT),
    (ServiceBusServerBusyError, ErrorKind.SERVER_BUSY),
    (ServiceBusQuotaExceededError, ErrorKind.QUOTA_EXCEEDED),
    (OperationTimeoutError, ErrorKind.TIMEOUT),
    (ServiceBusConnectionError, ErrorKind.CONNECTION),
    (ServiceBusCommunicationError, ErrorKind.CONNECTION),
    (MessageLockLostError, ErrorKind.LOCK_LOST),
    (SessionLockLostError, ErrorKind.LOCK_LOST),
    (MessageAlreadySettled, ErrorKind.INVALID_ARGUMENT),
    (MessageNotFoundError, ErrorKind.INVALID_ARGUMENT),
    (SessionCannotBeLockedError, ErrorKind.SERVICE_ERROR),
    (AutoLockRenewFailed, ErrorKind.LOCK_LOST),
    (AutoLockRenewTimeout, ErrorKind.LOCK_LOST),
    # Outside the SDK: georep's own deadline and the socket layer.
    (TimeoutError, ErrorKind.TIMEOUT),
    (OSError, ErrorKind.CONNECTION),
)

# Conditions the SDK maps to the plain ServiceBusError and marks retryable, although the
# request itself is wrong: retrying, or another region, would not help.
_ARGUMENT_CONDITIONS = frozenset(
    {"com.microsoft:argument-error", "com.microsoft:argument-out-of-range"}
)

#: SDK classes more specific than their kind's georep class says: raised as the georep
#: class that is also theirs.
_SPECIFIC: tuple[tuple[type[BaseException], type[RegionError]], ...] = (
    (MessageNotFoundError, georep_errors.MessageNotFoundError),
    (ServiceBusAuthorizationError, georep_errors.AccessDeniedError),
)

#: What the SDK's ValueError says when its handler was closed under a call.
_SHUT_DOWN = "handler has already been shutdown"

_ACCESS_HINT = (
    "the key's policy lacks the right this operation needs (Send, Listen or Manage): "
    "use a policy that has it in this namespace"
)
_HINTS = {
    ErrorKind.AUTHENTICATION: "check SharedAccessKeyName and SharedAccessKey for this namespace",
    ErrorKind.ENTITY_NOT_FOUND: "create the queue or topic in this namespace",
    ErrorKind.ENTITY_DISABLED: "enable the queue or topic in this namespace",
    ErrorKind.MESSAGE_TOO_LARGE: "shrink the message or split the batch",
    ErrorKind.QUOTA_EXCEEDED: "drain the entity or raise its maximum size",
    ErrorKind.INVALID_ARGUMENT: "the request is wrong, not the region: fix it and send again",
}


def error_kind(exc: BaseException) -> ErrorKind | None:
    """The :class:`ErrorKind` of an SDK (or socket) exception, or None if it is not one.

    A plain ``ServiceBusError`` is a failure inside the client when it wraps a non-SDK
    exception (the SDK wraps, for example, the ``UnicodeEncodeError`` of a message id that
    is not valid UTF-8 as "Handler failed"): INVALID_ARGUMENT. Otherwise it is a service
    error the SDK marks retryable (``amqp:internal-error``, unknown conditions):
    SERVICE_ERROR; or one it does not (``amqp:not-allowed``, ``amqp:decode-error``, ...)
    or an argument error: INVALID_ARGUMENT.

    georep's own errors are SDK classes too, but already translated: a
    :class:`~georep.exceptions.RegionError` keeps its kind, any other is not an SDK error.
    """
    if isinstance(exc, GeoReplicationError):
        return exc.kind if isinstance(exc, RegionError) else None
    for error_class, kind in SDK_ERROR_KINDS:
        if isinstance(exc, error_class):
            return kind
    if isinstance(exc, ServiceBusError):
        inner = getattr(exc, "inner_exception", None)
        condition = str(getattr(exc, "_condition", None) or "")
        if inner is not None and not isinstance(inner, ServiceBusError) and not condition:
            return ErrorKind.INVALID_ARGUMENT
        if condition in _ARGUMENT_CONDITIONS or not getattr(exc, "_retryable", False):
            return ErrorKind.INVALID_ARGUMENT
        return ErrorKind.SERVICE_ERROR
    if isinstance(exc, ValueError) and _SHUT_DOWN in str(exc):
        # The SDK's receiver or sender was closed under the call (a receiver closing during
        # an outage hands back what it holds after its link is gone): not a wrong request.
        return ErrorKind.CONNECTION
    if isinstance(exc, ValueError | TypeError):
        return ErrorKind.INVALID_ARGUMENT
    return None


def translate_error(exc: BaseException, *, region: str, namespace: str) -> RegionError | None:
    """The georep error for an SDK (or socket) exception, or None if it is not one.

    The text names the region and its namespace and carries the SDK's description (which
    never contains the key); the SDK exception is its ``inner_exception`` (and stays
    attached as ``__cause__`` where it is raised ``from``). A georep error is returned as it
    is.
    """
    if isinstance(exc, RegionError):
        return exc
    kind = error_kind(exc)
    if kind is None:
        return None
    detail = str(exc).strip() or type(exc).__name__
    hint = _ACCESS_HINT if isinstance(exc, ServiceBusAuthorizationError) else _HINTS.get(kind)
    message = f"{region} ({namespace}): {detail}" + (f"; {hint}" if hint else "")
    for sdk_class, specific in _SPECIFIC:
        if isinstance(exc, sdk_class):
            return specific(message, region=region, kind=kind, inner_exception=exc)
    return region_error(message, region=region, kind=kind, inner_exception=exc)
