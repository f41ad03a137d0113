"""Subscription rules: filters, actions, and which copies of a message a subscription gets.

Every subscription has a :class:`RuleSet`; a new one holds ``$Default`` (``TrueFilter``, no
action), as on the service. When a topic fans a message out, :meth:`RuleSet.route` says what
the subscription receives, following the service's documented semantics ("Topic filters and
actions"):

* all matching rules *without* an action together give **one** unmodified copy;
* every matching rule *with* an action gives **its own** copy, with the action applied and the
  application property ``RuleName`` set to that rule's name;
* no matching rule: nothing.

Filters see the message's system properties (``sys.``) and application properties; an action
rewrites only that copy's application properties. Nothing here does I/O or knows the wire
format beyond reading a message's properties (see :class:`StoredMessageContext`).
"""

from __future__ import annotations

__all__ = [
    "CORRELATION_FIELDS",
    "DEFAULT_RULE_NAME",
    "MAX_RULE_NAME_LENGTH",
    "Copy",
    "InvalidRuleError",
    "Rule",
    "RuleAction",
    "RuleError",
    "RuleExistsError",
    "RuleFilter",
    "RuleNotFoundError",
    "RuleSet",
    "StoredMessageContext",
]

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ._codec import (
    SECTION_APPLICATION_PROPERTIES,
    SECTION_PROPERTIES,
    Timestamp,
    decode_value,
    section_value_start,
    split_sections,
)
from ._sql import MessageContext, SqlAction, SqlError, parse_action, parse_filter, values_equal

if TYPE_CHECKING:
    from ._message import StoredMessage

_Parsed = TypeVar("_Parsed")

DEFAULT_RULE_NAME: Final = "$Default"
#: The service's limit on a rule name, in characters.
MAX_RULE_NAME_LENGTH: Final = 50
#: Correlation filter fields (the SDK's names) -> the system property each one matches.
CORRELATION_FIELDS: Final[dict[str, str]] = {
    "correlation_id": "correlationid",
    "message_id": "messageid",
    "to": "to",
    "reply_to": "replyto",
    "label": "label",
    "session_id": "sessionid",
    "reply_to_session_id": "replytosessionid",
    "content_type": "contenttype",
}


class RuleError(ValueError):
    """A rule operation the service refuses; ``status`` is the HTTP status it answers."""

    status: int = 400


class InvalidRuleError(RuleError):
    """The filter or action is not valid (bad SQL, unknown property, ...): ``400``."""


class RuleExistsError(RuleError):
    """A rule of that name already exists on the subscription: ``409``."""

    status = 409


class RuleNotFoundError(RuleError):
    """No rule of that name on the subscription: ``404``."""

    status = 404


def _parsed(
    parse: Callable[[str, Mapping[str, Any]], _Parsed],
    expression: str,
    parameters: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], _Parsed]:
    """The parameters as given, and ``expression`` parsed now with them (an
    :class:`InvalidRuleError` when it does not parse, as the service answers 400)."""
    given = dict(parameters or {})
    try:
        return given, parse(expression, given)
    except SqlError as exc:
        raise InvalidRuleError(str(exc)) from None


@dataclass(frozen=True)
class RuleFilter:
    """A rule's filter: ``TrueFilter``, ``FalseFilter``, ``SqlFilter`` or ``CorrelationFilter``.

    Build one with :meth:`sql`, :meth:`correlation`, :meth:`true` or :meth:`false`, which
    validate (and compile) it.

    Attributes:
        kind: The service's type name (the Atom ``xsi:type``).
        sql_expression: The expression of a SQL, true or false filter.
        parameters: ``@name`` -> value of a SQL filter.
        correlation: Correlation filter fields set (keys of :data:`CORRELATION_FIELDS`).
        properties: Application properties a correlation filter requires.
    """

    kind: str
    sql_expression: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    correlation: Mapping[str, str] = field(default_factory=dict)
    properties: Mapping[str, Any] = field(default_factory=dict)
    _matches: Callable[[MessageContext], bool] = field(
        default=lambda _message: True, repr=False, compare=False
    )

    @classmethod
    def true(cls) -> RuleFilter:
        return cls("TrueFilter", "1=1")

    @classmethod
    def false(cls) -> RuleFilter:
        return cls("FalseFilter", "1>1", _matches=lambda _message: False)

    @classmethod
    def sql(cls, expression: str, parameters: Mapping[str, Any] | None = None) -> RuleFilter:
        """A SQL filter, parsed now. Raises :class:`InvalidRuleError` if it does not parse."""
        given, compiled = _parsed(parse_filter, expression, parameters)
        return cls("SqlFilter", expression, given, _matches=compiled.matches)

    @classmethod
    def correlation_filter(
        cls, fields: Mapping[str, str | None], properties: Mapping[str, Any] | None = None
    ) -> RuleFilter:
        """A correlation filter: every field and property given must equal the message's."""
        unknown = set(fields) - set(CORRELATION_FIELDS)
        if unknown:
            raise InvalidRuleError(f"Unknown correlation filter fields: {sorted(unknown)}.")
        given = {name: value for name, value in fields.items() if value is not None}
        required = dict(properties or {})
        if not given and not required:
            raise InvalidRuleError(
                "A CorrelationFilter must set at least one system property or application "
                "property to match; use a TrueFilter to accept every message."
            )

        def matches(message: MessageContext) -> bool:
            for name, expected in given.items():
                actual = message.system_property(CORRELATION_FIELDS[name])
                if actual is None or str(actual) != expected:
                    return False
            user = message.user_properties
            return all(
                key in user and values_equal(user[key], value) for key, value in required.items()
            )

        return cls("CorrelationFilter", None, {}, given, required, _matches=matches)

    def matches(self, message: MessageContext) -> bool:
        return self._matches(message)


@dataclass(frozen=True)
class RuleAction:
    """A rule's action: ``EmptyRuleAction`` (``compiled`` is None) or ``SqlRuleAction``."""

    sql_expression: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    compiled: SqlAction | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        return "EmptyRuleAction" if self.compiled is None else "SqlRuleAction"

    @classmethod
    def sql(cls, expression: str, parameters: Mapping[str, Any] | None = None) -> RuleAction:
        """A SQL action, parsed now. Raises :class:`InvalidRuleError` if it does not parse."""
        return cls(expression, *_parsed(parse_action, expression, parameters))


@dataclass(frozen=True)
class Rule:
    """A named rule of a subscription; ``created_at`` is in seconds since the epoch."""

    name: str
    filter: RuleFilter
    action: RuleAction = field(default_factory=RuleAction)
    created_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > MAX_RULE_NAME_LENGTH or "/" in self.name:
            raise InvalidRuleError(
                f"The rule name '{self.name}' is invalid: use 1 to {MAX_RULE_NAME_LENGTH} "
                "characters, without '/'."
            )


@dataclass(frozen=True)
class Copy:
    """One copy of a message for a subscription, and how its application properties change."""

    rule_name: str | None = None
    """The action rule that made this copy (None: the copy of the rules without actions)."""
    changes: Mapping[str, Any] = field(default_factory=dict)
    removed: frozenset[str] = frozenset()


_UNCHANGED: Final = Copy()


class RuleSet:
    """The rules of one subscription, by name (case-insensitive, as the service)."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules: dict[str, Rule] = {}
        for rule in rules:
            self.add(rule)

    @classmethod
    def with_default(cls, created_at: float) -> RuleSet:
        """The rules of a new subscription: ``$Default`` with a ``TrueFilter``."""
        return cls([Rule(DEFAULT_RULE_NAME, RuleFilter.true(), created_at=created_at)])

    def __iter__(self) -> Any:
        return iter(list(self._rules.values()))

    def __len__(self) -> int:
        return len(self._rules)

    def get(self, name: str) -> Rule | None:
        return self._rules.get(name.lower())

    def add(self, rule: Rule) -> None:
        """Raises :class:`RuleExistsError` if the name is taken."""
        if rule.name.lower() in self._rules:
            raise RuleExistsError(
                f"The messaging entity rule '{rule.name}' already exists. Delete it first, "
                "or update it (update_rule)."
            )
        self._rules[rule.name.lower()] = rule

    def replace(self, rule: Rule) -> Rule:
        """Replace the rule of that name, keeping its creation time and position.

        Raises:
            RuleNotFoundError: No such rule.
        """
        old = self._rules.get(rule.name.lower())
        if old is None:
            raise RuleNotFoundError(f"The rule '{rule.name}' could not be found.")
        new = Rule(old.name, rule.filter, rule.action, old.created_at)
        self._rules[rule.name.lower()] = new
        return new

    def remove(self, name: str) -> None:
        """Raises :class:`RuleNotFoundError` if there is no such rule."""
        if self._rules.pop(name.lower(), None) is None:
            raise RuleNotFoundError(f"The rule '{name}' could not be found.")

    def count(self, kind: str) -> int:
        """How many rules have a filter of ``kind`` (e.g. ``"SqlFilter"``)."""
        return sum(1 for rule in self._rules.values() if rule.filter.kind == kind)

    def route(self, context: Callable[[], MessageContext]) -> list[Copy]:
        """The copies of one message this subscription gets (see the module docstring).

        Args:
            context: Builds the message's view; called at most once, and only when a rule
                needs to look at the message (not for a lone ``$Default``).
        """
        if len(self._rules) == 1:
            [only] = self._rules.values()
            if only.filter.kind == "TrueFilter" and only.action.compiled is None:
                return [_UNCHANGED]  # the common case: nothing to decode
        message = context()
        plain = False
        copies: list[Copy] = []
        for rule in self._rules.values():
            if not rule.filter.matches(message):
                continue
            action = rule.action.compiled
            if action is None:
                plain = True
                continue
            changes, removed = action.apply(message)
            changes = {**changes, "RuleName": rule.name}
            copies.append(Copy(rule.name, changes, frozenset(removed - {"RuleName"})))
        return [_UNCHANGED, *copies] if plain else copies


# Positions in the AMQP properties list (message-id, user-id, to, subject, ...).
_PROPERTY_INDEX: Final = {
    "messageid": 0,
    "to": 2,
    "label": 3,
    "replyto": 4,
    "correlationid": 5,
    "contenttype": 6,
    "sessionid": 10,
    "replytosessionid": 12,
}


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _plain(value: Any) -> Any:
    """An AMQP value as the filter language sees it (timestamps as UTC datetimes)."""
    if isinstance(value, Timestamp):
        return datetime.fromtimestamp(value / 1000, UTC)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return value


class StoredMessageContext:
    """A message being fanned out, as filters and actions read it (decoded lazily)."""

    def __init__(self, message: StoredMessage) -> None:
        self._message = message
        self._properties: list[Any] | None = None
        self._user: dict[str, Any] | None = None

    def _sections(self) -> None:
        properties: list[Any] = []
        user: dict[str, Any] = {}
        bare = self._message.bare
        for code, start, _ in split_sections(bare):
            if code == SECTION_PROPERTIES:
                properties = list(decode_value(bare, section_value_start(bare, start))[0] or [])
            elif code == SECTION_APPLICATION_PROPERTIES:
                decoded = decode_value(bare, section_value_start(bare, start))[0] or {}
                for key, value in decoded.items():
                    name = key.decode("utf-8") if isinstance(key, bytes) else str(key)
                    user[name] = _plain(value)
        self._properties, self._user = properties, user

    @property
    def user_properties(self) -> Mapping[str, Any]:
        if self._user is None:
            self._sections()
        assert self._user is not None
        return self._user

    def system_property(self, name: str) -> Any:
        message = self._message
        index = _PROPERTY_INDEX.get(name)
        if index is not None:
            if self._properties is None:
                self._sections()
            assert self._properties is not None
            value = self._properties[index] if index < len(self._properties) else None
            return _plain(value)
        ttl = timedelta(milliseconds=message.ttl_ms) if message.ttl_ms else None
        return {
            "partitionkey": message.partition_key,
            "deliverycount": message.delivery_count,
            "sequencenumber": message.sequence_number,
            "enqueuedsequencenumber": message.sequence_number,
            "enqueuedtimeutc": _utc(message.enqueued_at),
            "scheduledenqueuetimeutc": _utc(message.scheduled_at),
            "expiresatutc": _utc(message.expires_at),
            "timetolive": ttl,
            "size": message.size,
        }.get(name)
