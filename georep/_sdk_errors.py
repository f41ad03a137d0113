"""The azure-servicebus exception classes georep's errors also are (issue 27).

Every error georep raises is also the SDK's class for the same failure
(:mod:`georep.exceptions` says which), so an application's ``except ServiceBusError:``
keeps working when it moves from the SDK to georep. ``except`` matches by real
inheritance only, so georep's classes must subclass the SDK's: this module gives them the
SDK's classes when the SDK is installed, and stand-ins with the same names and builtin
bases when it is not.

Why not a core dependency on azure-servicebus: the core knows nothing of Azure (it
talks to Service Bus through ports), and an application that uses only the relay channel
or the test kit has no SDK. Such an application cannot name an SDK class in an
``except`` either, so the stand-ins lose it nothing; an application that has the SDK
gets the real classes. The cost: ``import georep`` imports ``azure.servicebus`` when it is
installed (the SDK's package imports all of itself to give its exceptions module).

This is the one core module that imports the SDK at module level, and it imports only
``azure.servicebus.exceptions`` (``tests/unit/test_layers.py`` holds both rules), once, as
:data:`sdk`: georep's modules name the classes ``sdk.ServiceBusError``..., whether they are
the SDK's or the stand-ins.
"""

from __future__ import annotations

__all__ = ["SDK_INSTALLED", "sdk"]

try:
    import azure.servicebus.exceptions as sdk

    SDK_INSTALLED = True
    """True when :data:`sdk` is the SDK's exceptions module, False when it holds the stand-ins."""
except ImportError:
    SDK_INSTALLED = False

    class sdk:  # type: ignore[no-redef]  # a namespace with the module's name
        """Stand-ins: the SDK's hierarchy (and its builtin bases) without the SDK. georep's
        errors set their own attributes and never call these constructors."""

        class ServiceBusError(Exception):
            """Stands in for ``azure.servicebus.exceptions.ServiceBusError``."""

        class ServiceBusConnectionError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class ServiceBusCommunicationError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class ServiceBusAuthenticationError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class ServiceBusAuthorizationError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class OperationTimeoutError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class MessageSizeExceededError(ServiceBusError, ValueError):
            """Stands in for the SDK's class of that name."""

        class MessageAlreadySettled(ValueError):
            """Stands in for the SDK's class of that name (a ValueError, not a
            ServiceBusError, as in the SDK)."""

        class MessageNotFoundError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class MessageLockLostError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class SessionLockLostError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class MessagingEntityNotFoundError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class MessagingEntityDisabledError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class ServiceBusQuotaExceededError(ServiceBusError):
            """Stands in for the SDK's class of that name."""

        class ServiceBusServerBusyError(ServiceBusError):
            """Stands in for the SDK's class of that name."""
