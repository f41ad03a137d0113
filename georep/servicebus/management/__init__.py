"""The drop-in ``ServiceBusAdministrationClient`` over two namespaces: every create,
update and delete applied to both, gets and lists that say where they differ. The SDK's
property and rule types are re-exported (importing them from
``azure.servicebus.management``, as before, works too)."""

from __future__ import annotations

from georep.servicebus._models import *  # noqa: F403 - the SDK's models, re-exported
from georep.servicebus._models import __all__ as _models

from ._client import Paged, ServiceBusAdministrationClient

__all__ = [*_models, "Paged", "ServiceBusAdministrationClient"]
