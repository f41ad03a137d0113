"""The ``georep`` data source's options: read from Spark's option map and checked.

Spark hands a data source its options as a case-insensitive map of strings (the keys
arrive lower-cased), so every value is parsed here, once, on the driver, and a mistake
is reported with the option's name and the fix. The parsed settings are frozen
dataclasses that pickle to the Python workers; connection strings stay out of their
``repr`` (and so out of Spark's logs and errors).
"""

from __future__ import annotations

__all__ = ["Connection", "Entity", "Options", "connection", "entity"]

import importlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from georep._endpoint import Target, namespace_endpoint
from georep.exceptions import ConfigurationError

_CONNECTION_OPTIONS = (
    "primaryConnectionString",
    "secondaryConnectionString",
    "primaryNamespace",
    "secondaryNamespace",
    "credential",
)
_ENTITY_OPTIONS = ("queueName", "topicName", "subscriptionName")
_IGNORED = frozenset({"path", "checkpointlocation"})
"""Options Spark itself may pass along (``load(path)``, ``save(path)``)."""


class Options:
    """Spark's options for one read or write, looked up by their documented names.

    Args:
        given: The options as Spark passes them (any key case).
        known: Every option this use of the source accepts (documented spelling).
        what: What is being configured, for errors (``"the georep source"``).

    Raises:
        ConfigurationError: An option is not one of ``known`` (a typo would otherwise be
            ignored silently); the message lists the accepted ones.
    """

    def __init__(self, given: Mapping[str, str], known: Iterable[str], what: str) -> None:
        self.what = what
        self._names = {name.lower(): name for name in known}
        self._values = {str(k).lower(): str(v) for k, v in given.items() if v is not None}
        unknown = sorted(k for k in self._values if k not in self._names and k not in _IGNORED)
        if unknown:
            raise ConfigurationError(
                f"{what} has no option {unknown[0]!r}; it takes "
                f"{', '.join(sorted(self._names.values()))}"
            )

    def text(self, name: str, default: str | None = None) -> str | None:
        """The option's value stripped (``default`` when absent or blank)."""
        value = self._values.get(name.lower(), "").strip()
        return value or default

    def required(self, name: str, hint: str) -> str:
        """The option's value.

        Raises:
            ConfigurationError: It is absent; ``hint`` says what to give.
        """
        value = self.text(name)
        if value is None:
            raise ConfigurationError(f"{self.what} needs option {name!r}: {hint}")
        return value

    def integer(self, name: str, default: int, minimum: int = 1) -> int:
        """The option as a whole number >= ``minimum`` (``default`` when absent).

        Raises:
            ConfigurationError: It is not a whole number, or is below ``minimum``.
        """
        value = self.text(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigurationError(
                f"{self.what}: option {name!r} must be a whole number, got {value!r}"
            ) from None
        if number < minimum:
            raise ConfigurationError(
                f"{self.what}: option {name!r} must be at least {minimum}, got {number}"
            )
        return number

    def seconds(self, name: str, default: float) -> float:
        """The option as a positive, finite number of seconds (``default`` when absent).

        Raises:
            ConfigurationError: It is not such a number.
        """
        value = self.text(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise ConfigurationError(
                f"{self.what}: option {name!r} must be a positive number of seconds, got {value!r}"
            )
        return number

    def choice(self, name: str, default: str, choices: Iterable[str]) -> str:
        """The option, one of ``choices`` (case-insensitive; ``default`` when absent).

        Raises:
            ConfigurationError: It is something else.
        """
        allowed = list(choices)
        value = (self.text(name) or default).lower()
        if value not in allowed:
            raise ConfigurationError(
                f"{self.what}: option {name!r} must be one of {', '.join(allowed)}, got {value!r}"
            )
        return value


@dataclass(frozen=True)
class Connection:
    """How both regions' namespaces are reached: two connection strings, or two namespaces
    and a credential (see :func:`connection`). Never shows a connection string."""

    primary: str = field(repr=False)
    secondary: str = field(repr=False)
    credential: str | None = None
    """``None`` with connection strings; else ``"default"`` or ``"module:callable"``."""

    def targets(self) -> tuple[Target, Target]:
        """Both regions as georep's ``from_connection_strings`` constructors take them.

        With namespaces, the credential is made here (on the worker that connects).

        Raises:
            ConfigurationError: The credential cannot be made.
            ImportError: ``credential=default`` without azure-identity installed.
        """
        if self.credential is None:
            return self.primary, self.secondary
        credential = _credential(self.credential)
        return (
            namespace_endpoint(self.primary, credential, region="primary"),
            namespace_endpoint(self.secondary, credential, region="secondary"),
        )


@dataclass(frozen=True)
class Entity:
    """The queue, or the topic (and, to read, its subscription)."""

    queue_name: str | None = None
    topic_name: str | None = None
    subscription_name: str | None = None

    @property
    def path(self) -> str:
        """The entity path (``queue``, ``topic`` or ``topic/Subscriptions/sub``)."""
        if self.queue_name is not None:
            return self.queue_name
        topic = str(self.topic_name)
        subscription = self.subscription_name
        return topic if subscription is None else f"{topic}/Subscriptions/{subscription}"


def connection(options: Options) -> Connection:
    """Both regions' namespaces from the options.

    Either ``primaryConnectionString`` and ``secondaryConnectionString``, or
    ``primaryNamespace`` and ``secondaryNamespace`` (fully qualified) with ``credential``:
    ``default`` (azure-identity's ``DefaultAzureCredential``) or ``module:callable``
    naming a function, importable on the driver and the executors, that returns one.

    Raises:
        ConfigurationError: Neither pair, both, or half of one is given.
    """
    strings = (options.text("primaryConnectionString"), options.text("secondaryConnectionString"))
    names = (options.text("primaryNamespace"), options.text("secondaryNamespace"))
    hint = (
        "give primaryConnectionString and secondaryConnectionString, or primaryNamespace "
        "and secondaryNamespace with credential"
    )
    if any(strings) and any(names):
        raise ConfigurationError(f"{options.what}: both connection strings and namespaces: {hint}")
    if any(strings):
        if not all(strings):
            raise ConfigurationError(f"{options.what}: one connection string is missing: {hint}")
        if options.text("credential") is not None:
            raise ConfigurationError(
                f"{options.what}: option 'credential' goes with namespaces, not with "
                "connection strings (they carry their own key)"
            )
        return Connection(str(strings[0]), str(strings[1]))
    if all(names):
        credential = options.text("credential", "default")
        return Connection(str(names[0]), str(names[1]), credential=credential)
    raise ConfigurationError(f"{options.what} needs both regions' namespaces: {hint}")


def entity(options: Options, *, reading: bool) -> Entity:
    """The entity from ``queueName``, or ``topicName`` (and, to read, ``subscriptionName``).

    Raises:
        ConfigurationError: Neither or both are named, or a subscription is missing (reading)
            or given (writing).
    """
    queue, topic = options.text("queueName"), options.text("topicName")
    subscription = options.text("subscriptionName")
    if (queue is None) == (topic is None):
        names = "queueName or topicName"
        if reading:
            names = "queueName, or topicName and subscriptionName"
        raise ConfigurationError(f"{options.what}: name exactly one entity: {names}")
    if reading and topic is not None and subscription is None:
        raise ConfigurationError(
            f"{options.what}: a topic is read through a subscription: add subscriptionName"
        )
    if subscription is not None and (queue is not None or not reading):
        raise ConfigurationError(
            f"{options.what}: subscriptionName goes with topicName when reading only"
        )
    return Entity(queue, topic, subscription)


def connection_options() -> tuple[str, ...]:
    """The connection and entity option names every use of the source accepts."""
    return _CONNECTION_OPTIONS + _ENTITY_OPTIONS


def _credential(spec: str) -> Any:
    """The credential ``spec`` names: ``default`` or ``module:callable``.

    Raises:
        ConfigurationError: ``spec`` is neither, or the callable cannot be found.
        ImportError: ``default`` without azure-identity.
    """
    if spec.lower() == "default":
        try:
            identity = importlib.import_module("azure.identity.aio")
        except ImportError as exc:
            raise ImportError(
                "credential=default needs azure-identity: pip install azure-identity"
            ) from exc
        return identity.DefaultAzureCredential()
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"option 'credential' must be 'default' or 'module:callable', got {spec!r}"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"option 'credential': cannot find {spec!r} ({exc}); it must be importable on "
            "the driver and every executor"
        ) from exc
    return factory()
