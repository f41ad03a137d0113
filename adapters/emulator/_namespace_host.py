"""What a namespace's protocol handlers need from the server that hosts the namespace.

The AMQP connection (``_amqp``, also over WebSockets in ``_websocket``), the Hybrid
Connections relay (``_relay``) and the admin API's backend (``_admin_backend``) each serve
one namespace. They need its broker state, its faults and its keys, which
:class:`~._server.NamespaceServer` holds; but the server makes those handlers, so they see
it through :class:`NamespaceHost` and never import ``_server``.
"""

from __future__ import annotations

__all__ = ["ClientConnection", "NamespaceHost"]

from typing import Protocol

from ._broker import Namespace
from ._faults import Faults
from ._sas import SasGrant


class ClientConnection(Protocol):
    """A client's AMQP connection, as the namespace's faults act on it."""

    paused: bool
    """Blackholed: it reads nothing and answers nothing."""

    def abort(self) -> None:
        """Drop the connection now (an outage)."""


class NamespaceHost(Protocol):
    """One emulated namespace, as the handlers of its connections use it."""

    @property
    def namespace(self) -> Namespace:
        """The namespace's broker state: entities, messages, locks."""

    @property
    def faults(self) -> Faults:
        """The faults in force now (replaced by a fresh object on restore)."""

    @property
    def connections(self) -> set[ClientConnection]:
        """Open AMQP connections: each adds itself when made and removes itself when lost."""

    def count_operation(self) -> None:
        """Count one message sent or scheduled (``NamespaceServer.operations``)."""

    def grant(self, token: str, *, port: int | None = None) -> SasGrant:
        """What the SAS or Entra ID ``token`` allows.

        Args:
            token: The token.
            port: The port the token must name (default: the namespace's AMQP port).

        Raises:
            PermissionError: the token is malformed, unknown, expired or for another
                namespace.
        """
