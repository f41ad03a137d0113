"""The one place azure-servicebus exceptions become georep errors."""

from __future__ import annotations

from azure.servicebus.exceptions import (
    MessageSizeExceededError,
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
)

from georep.exceptions import (
    AuthenticationError,
    EntityNotFoundError,
    MessageTooLargeError,
    RegionError,
    RegionUnavailableError,
)
from georep.ports import ErrorKind

__all__ = ["translate_error"]

_HINTS = {
    ErrorKind.AUTHENTICATION: "check SharedAccessKeyName and SharedAccessKey for this namespace",
    ErrorKind.ENTITY_NOT_FOUND: "create the queue or topic in this namespace",
    ErrorKind.ENTITY_DISABLED: "enable the queue or topic in this namespace",
    ErrorKind.MESSAGE_TOO_LARGE: "shrink the message or split the batch",
    ErrorKind.QUOTA_EXCEEDED: "drain the entity or raise its maximum size",
}


def translate_error(exc: BaseException, *, region: str, namespace: str) -> RegionError | None:
    """The georep error for an SDK (or socket) exception, or None if it is not one.

    The text names the region and its namespace and carries the SDK's description (which
    never contains the key); the SDK exception stays attached as ``__cause__``.
    """
    kind: ErrorKind
    error_type: type[RegionError] = RegionError
    if isinstance(exc, MessageSizeExceededError):
        kind, error_type = ErrorKind.MESSAGE_TOO_LARGE, MessageTooLargeError
    elif isinstance(exc, ServiceBusAuthenticationError | ServiceBusAuthorizationError):
        kind, error_type = ErrorKind.AUTHENTICATION, AuthenticationError
    elif isinstance(exc, MessagingEntityNotFoundError):
        kind, error_type = ErrorKind.ENTITY_NOT_FOUND, EntityNotFoundError
    elif isinstance(exc, MessagingEntityDisabledError):
        kind, error_type = ErrorKind.ENTITY_DISABLED, EntityNotFoundError
    elif isinstance(exc, ServiceBusServerBusyError):
        kind = ErrorKind.SERVER_BUSY
    elif isinstance(exc, ServiceBusQuotaExceededError):
        kind = ErrorKind.QUOTA_EXCEEDED
    elif isinstance(exc, OperationTimeoutError | TimeoutError):
        kind, error_type = ErrorKind.TIMEOUT, RegionUnavailableError
    elif isinstance(exc, ServiceBusConnectionError | ServiceBusCommunicationError | OSError):
        kind, error_type = ErrorKind.CONNECTION, RegionUnavailableError
    elif isinstance(exc, ServiceBusError):
        kind, error_type = ErrorKind.SERVICE_ERROR, RegionUnavailableError
    elif isinstance(exc, ValueError | TypeError):
        kind = ErrorKind.INVALID_ARGUMENT
    else:
        return None
    detail = str(exc).strip() or type(exc).__name__
    hint = _HINTS.get(kind)
    message = f"{region} ({namespace}): {detail}" + (f"; {hint}" if hint else "")
    return error_type(message, region=region, kind=kind)
