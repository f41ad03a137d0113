"""How a ``from_...`` constructor reaches a namespace: a connection string, or a namespace and
a credential, each with the client settings to pass through to ``ServiceBusClient``."""

from __future__ import annotations

__all__ = [
    "FromNamespaces",
    "NamespaceEndpoint",
    "Target",
    "namespace_endpoint",
    "one_entity",
    "with_client_options",
    "with_client_options_pair",
]

import asyncio
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from georep._secrets import mask_secrets
from georep.exceptions import ConfigurationError


@dataclass(frozen=True, repr=False)
class NamespaceEndpoint:
    """One region's namespace as the SDK client is opened for it: what the drop-in
    ``ServiceBusClient(primary, secondary, **options)`` takes where a region needs settings
    of its own (``custom_endpoint_address``), e.g.
    ``NamespaceEndpoint(primary_conn, client_options={"custom_endpoint_address": ...})``.

    Exactly one of ``connection_string`` and ``credential`` is set; ``client_options`` are
    ``ServiceBusClient`` keyword arguments (``fully_qualified_namespace`` with a credential,
    ``transport_type``, ``http_proxy``, ``custom_endpoint_address``, ``connection_verify``,
    retry settings...), applied over georep's defaults.
    """

    connection_string: str | None = None
    credential: Any = None
    client_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return str(self.client_options.get("fully_qualified_namespace", "?"))

    def __repr__(self) -> str:  # never the connection string or the credential
        return f"NamespaceEndpoint({self.namespace!r})"


Target = str | NamespaceEndpoint

Namespace = str | Mapping[str, Any]
"""A namespace for ``from_namespaces``: its fully qualified name, or a mapping of
``ServiceBusClient`` keyword arguments that names it (see :func:`namespace_endpoint`)."""


def check_connection_string(connection_string: str, region: str) -> None:
    """Reject a malformed connection string without ever echoing it (it holds the key)."""
    if not isinstance(connection_string, str):
        raise ConfigurationError(
            f"the {region} connection string must be a str, not "
            f"{type(connection_string).__name__}: copy it from the namespace's 'Shared "
            "access policies' page (or use from_namespaces with a credential)"
        )
    if not connection_string.strip():
        raise ConfigurationError(
            f"the {region} connection string is empty: copy it from the namespace's "
            "'Shared access policies' page"
        )
    if "=" not in connection_string:
        raise ConfigurationError(
            f"the {region} connection string has no 'Name=value' parts: for a namespace "
            "name (NAME.servicebus.windows.net) and a credential, use "
            "from_namespaces(primary, secondary, credential); for connection strings, "
            "'Endpoint=sb://NAME.servicebus.windows.net/;SharedAccessKeyName=...;"
            "SharedAccessKey=...' (copy it from the namespace's 'Shared access policies')"
        )
    parts = dict(
        part.split("=", 1)
        for part in connection_string.strip().rstrip(";").split(";")
        if "=" in part
    )
    keys = {key.lower() for key in parts}
    missing = [
        name
        for name, present in (
            ("Endpoint", "endpoint" in keys),
            (
                "SharedAccessKeyName/SharedAccessKey or SharedAccessSignature",
                {"sharedaccesskeyname", "sharedaccesskey"} <= keys
                or "sharedaccesssignature" in keys,
            ),
        )
        if not present
    ]
    malformed = any("=" not in part for part in connection_string.strip().rstrip(";").split(";"))
    if missing or malformed:
        problem = f"lacks {' and '.join(missing)}" if missing else "is malformed"
        raise ConfigurationError(
            f"the {region} connection string {problem}: expected "
            "'Endpoint=sb://NAME.servicebus.windows.net/;SharedAccessKeyName=...;"
            "SharedAccessKey=...' (copy it from the namespace's 'Shared access policies')"
        )
    endpoint = next(v for k, v in parts.items() if k.strip().lower() == "endpoint").strip()
    host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    if not host:
        raise ConfigurationError(
            f"the {region} connection string's Endpoint names no host: expected "
            "'Endpoint=sb://NAME.servicebus.windows.net/;...' (copy it from the namespace's "
            "'Shared access policies')"
        )


def with_client_options(target: Target, client_options: Mapping[str, Any] | None) -> Target:
    """``target`` with ``client_options`` added (unchanged when there are none)."""
    if not client_options:
        return target
    if isinstance(target, str):
        return NamespaceEndpoint(connection_string=target, client_options=dict(client_options))
    return NamespaceEndpoint(
        target.connection_string,
        target.credential,
        {**client_options, **target.client_options},
    )


def with_client_options_pair(
    primary: Target, secondary: Target, client_options: Mapping[str, Any] | None
) -> tuple[Target, Target]:
    """Both regions' targets with ``client_options`` added: how every
    ``from_connection_strings`` starts."""
    return (
        with_client_options(primary, client_options),
        with_client_options(secondary, client_options),
    )


#: What an entity name may hold (Service Bus: letters, digits, ``.``, ``-``, ``_`` and
#: ``/``; ``$`` for the system paths such as ``$DeadLetterQueue``), starting with a letter or
#: digit, up to 260 characters.
_ENTITY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/$-]{0,259}")


def check_entity_names(**names: str | None) -> None:
    """Refuse a queue, topic or subscription name Service Bus could never have, before
    anything is opened, without echoing one that holds a key (a connection string passed
    as the name by mistake: the SDK's error for it would carry the key).

    Raises:
        ConfigurationError: A name is not a str, or not a possible entity name.
    """
    for argument, name in names.items():
        if name is None:
            continue
        if not isinstance(name, str):
            raise ConfigurationError(
                f"{argument}= must be the entity's name (a str), not {type(name).__name__}"
            )
        if _ENTITY_NAME.fullmatch(name) is None:
            shown = "(a connection string?)" if "=" in name else repr(mask_secrets(name))
            raise ConfigurationError(
                f"{argument}= {shown} is not a Service Bus entity name: letters, digits, "
                "'.', '-', '_' and '/', starting with a letter or digit, at most 260 "
                "characters; the connection string goes in its own argument"
            )


def one_entity(queue_name: str | None, topic_name: str | None) -> None:
    """Check that a sender's ``from_connection_strings`` names exactly one entity.

    Raises:
        ConfigurationError: Neither or both are named.
    """
    if (queue_name is None) == (topic_name is None):
        raise ConfigurationError("name exactly one of queue_name= or topic_name=")
    name = queue_name if queue_name is not None else topic_name
    if not isinstance(name, str) or not name.strip():
        which = "queue_name" if queue_name is not None else "topic_name"
        raise ConfigurationError(f"{which}= must name the entity, got {name!r}")
    check_entity_names(queue_name=queue_name, topic_name=topic_name)


def namespace_endpoint(
    namespace: Namespace,
    credential: Any,
    *,
    region: str,
    client_options: Mapping[str, Any] | None = None,
) -> NamespaceEndpoint:
    """A namespace reached with ``credential``.

    Args:
        namespace: The fully qualified namespace (``contoso.servicebus.windows.net``), or a
            mapping of ``ServiceBusClient`` keyword arguments for this region that names it
            (``fully_qualified_namespace`` plus, e.g., ``custom_endpoint_address``, and a
            ``credential`` of its own, which wins over ``credential``).
        credential: An ``AsyncTokenCredential`` or ``TokenCredential`` (Microsoft Entra ID,
            e.g. ``DefaultAzureCredential``; a sync one is called on a worker thread),
            ``AzureNamedKeyCredential`` or ``AzureSasCredential``.
        region: The region's label, for errors.
        client_options: Settings for both regions, under the per-region mapping's.

    Raises:
        ConfigurationError: No namespace, or no credential.
    """
    options = (
        {"fully_qualified_namespace": namespace} if isinstance(namespace, str) else dict(namespace)
    )
    # A region may bring its own credential (SAS keys differ per namespace).
    credential = options.pop("credential", credential)
    if not str(options.get("fully_qualified_namespace") or "").strip():
        raise ConfigurationError(
            f"the {region} namespace is empty: give its fully qualified name, e.g. "
            "'contoso.servicebus.windows.net'"
        )
    if credential is None:
        raise ConfigurationError(
            "from_namespaces needs a credential: an AsyncTokenCredential or TokenCredential "
            "(e.g. azure.identity's DefaultAzureCredential), AzureNamedKeyCredential or "
            "AzureSasCredential"
        )
    return NamespaceEndpoint(
        credential=_awaitable(credential), client_options={**(client_options or {}), **options}
    )


def _awaitable(credential: Any) -> Any:
    """georep's clients are async: a sync ``TokenCredential`` is called on a thread."""
    get_token = getattr(credential, "get_token", None)
    if get_token is None or inspect.iscoroutinefunction(get_token):
        return credential
    return _OnThread(credential)


class _OnThread:
    """An ``AsyncTokenCredential`` over a sync ``TokenCredential``."""

    def __init__(self, credential: Any) -> None:
        self._credential = credential

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._credential.get_token, *scopes, **kwargs)

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> _OnThread:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def endpoint_pair(
    primary: Namespace,
    secondary: Namespace,
    credential: Any,
    client_options: Mapping[str, Any] | None,
) -> tuple[NamespaceEndpoint, NamespaceEndpoint]:
    """Both regions' endpoints for a ``from_namespaces`` constructor (one credential)."""
    return (
        namespace_endpoint(primary, credential, region="primary", client_options=client_options),
        namespace_endpoint(
            secondary, credential, region="secondary", client_options=client_options
        ),
    )


class FromNamespaces:
    """``from_namespaces``, for every class with a ``from_connection_strings`` constructor."""

    @classmethod
    def from_namespaces(
        cls,
        primary: Namespace,
        secondary: Namespace,
        credential: Any = None,
        *,
        client_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Self:
        """As ``from_connection_strings``, reaching each namespace with ``credential``.

        For namespaces that disable local (SAS) authentication.

        Args:
            primary: The primary's fully qualified namespace
                (``contoso-east.servicebus.windows.net``), or a mapping of
                ``ServiceBusClient`` keyword arguments for it that names it
                (``fully_qualified_namespace``, plus e.g. ``custom_endpoint_address``).
            secondary: The secondary's, likewise. Each mapping may carry its own
                ``credential`` (SAS keys differ per namespace).
            credential: ``AsyncTokenCredential`` or ``TokenCredential`` (Microsoft Entra
                ID, managed identity: e.g. ``azure.identity.aio.DefaultAzureCredential``;
                a sync one is called on a worker thread), ``AzureNamedKeyCredential`` or
                ``AzureSasCredential``.
            client_options: ``ServiceBusClient`` settings for both regions
                (``transport_type``, ``http_proxy``, ``connection_verify``, retry
                settings...).
            **kwargs: As for ``from_connection_strings`` (the entity, options...).

        Raises:
            ConfigurationError: No namespace or no credential, or as
                ``from_connection_strings``.
        """
        made: Self = cls.from_connection_strings(  # type: ignore[attr-defined]
            *endpoint_pair(primary, secondary, credential, client_options), **kwargs
        )
        return made
