"""The SQL-92 subset of Service Bus rule filters and actions: parser and evaluator.

A ``SqlFilter`` expression (``color = 'blue' AND sys.Label LIKE 'ord%'``) and a
``SqlRuleAction`` (``SET priority = 'high'; REMOVE temp``) are parsed once, when the rule is
created, with a LALR grammar (``lark``), into Python closures evaluated per message. The
language is the one Azure documents in "Subscription Rule SQL Filter Syntax" and "SQL action
syntax": comparisons, ``AND``/``OR``/``NOT``, ``[NOT] IN``, ``[NOT] LIKE ... [ESCAPE ...]``,
``IS [NOT] NULL``, ``EXISTS(...)``, arithmetic, string/number/boolean/``NULL`` constants,
``@parameters``, the functions ``newid()`` and ``property(name)``, and ``sys.``/``user.``
scopes (no scope means ``user``).

Values follow SQL three-valued logic: a user property that is not on the message is unknown
(``None`` here), and so is any comparison, arithmetic, ``LIKE`` or ``IN`` involving it; ``NOT``
of unknown is unknown; ``AND``/``OR`` follow the SQL truth tables. A filter matches only when
it evaluates to ``TRUE``. Referring to a system property that does not exist is an error at
creation, as on the service.
"""

from __future__ import annotations

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "SYSTEM_PROPERTIES",
    "MessageContext",
    "SqlAction",
    "SqlError",
    "SqlFilter",
    "parse_action",
    "parse_filter",
    "values_equal",
]

import functools
import operator
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, VisitError

#: The service refuses filter and action expressions longer than this (characters).
MAX_EXPRESSION_LENGTH: Final = 1024

#: System properties a ``sys.`` reference may name (lower case -> the service's spelling).
SYSTEM_PROPERTIES: Final[dict[str, str]] = {
    name.lower(): name
    for name in (
        "MessageId",
        "CorrelationId",
        "To",
        "ReplyTo",
        "Label",
        "SessionId",
        "ReplyToSessionId",
        "ContentType",
        "PartitionKey",
        "DeliveryCount",
        "SequenceNumber",
        "EnqueuedSequenceNumber",
        "EnqueuedTimeUtc",
        "ScheduledEnqueueTimeUtc",
        "ExpiresAtUtc",
        "TimeToLive",
        "Size",
    )
}

_SYNTAX_HELP: Final = (
    "See https://learn.microsoft.com/azure/service-bus-messaging/service-bus-messaging-sql-filter"
)

_GRAMMAR: Final = r"""
filter: expr

action: (statement ";"?)+
?statement: "SET"i property EQ expr     -> set_
          | "REMOVE"i property          -> remove

?expr: or_expr
?or_expr: and_expr | or_expr "OR"i and_expr          -> or_
?and_expr: not_expr | and_expr "AND"i not_expr       -> and_
?not_expr: cmp_expr | "NOT"i not_expr                -> not_
?cmp_expr: add_expr
    | add_expr (EQ | COMPOP) add_expr                 -> compare
    | add_expr "IS"i "NULL"i                          -> is_null
    | add_expr "IS"i "NOT"i "NULL"i                   -> is_not_null
    | add_expr "IN"i "(" expr_list ")"                -> in_
    | add_expr "NOT"i "IN"i "(" expr_list ")"         -> not_in
    | add_expr "LIKE"i add_expr escape                -> like
    | add_expr "NOT"i "LIKE"i add_expr escape         -> not_like
escape: ["ESCAPE"i add_expr]
expr_list: expr ("," expr)*
?add_expr: mul_expr | add_expr ADDOP mul_expr        -> arithmetic
?mul_expr: unary | mul_expr MULOP unary              -> arithmetic
?unary: primary | ADDOP unary                         -> sign
?primary: constant
    | property
    | PARAMETER                                       -> parameter
    | "EXISTS"i "(" property ")"                      -> exists
    | NAME "(" [expr] ")"                             -> function
    | "(" expr ")"
?constant: STRING                                     -> string
    | INTEGER                                         -> integer
    | DECIMAL                                         -> decimal
    | "TRUE"i                                         -> true
    | "FALSE"i                                        -> false
    | "NULL"i                                         -> null
property: (NAME ".")? identifier
?identifier: NAME | DELIMITED | QUOTED

EQ: "="
COMPOP: "<>" | "!=" | "<=" | ">=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/" | "%"
NAME: /[A-Za-z_][A-Za-z0-9_]*/
DELIMITED: /\[([^\]]|\]\])*\]/
QUOTED: /"([^"]|"")*"/
PARAMETER: /@[A-Za-z_][A-Za-z0-9_]*/
STRING: /'([^']|'')*'/
DECIMAL.2: /(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|\d+[eE][+-]?\d+/
INTEGER: /\d+/
%ignore /\s+/
"""


@functools.cache
def _parser() -> Lark:
    """The grammar's parser, built on first use (40 ms of an emulator start that most
    runs, with no SQL filter or action, never need)."""
    return Lark(_GRAMMAR, start=["filter", "action"], parser="lalr", maybe_placeholders=True)


class SqlError(ValueError):
    """An expression that does not parse or refers to something that does not exist."""


class MessageContext(Protocol):
    """What an expression reads from a message."""

    def system_property(self, name: str) -> Any:
        """The system property ``name`` (a key of :data:`SYSTEM_PROPERTIES`), or None."""

    @property
    def user_properties(self) -> Mapping[str, Any]:
        """The application properties (the action's edits included, while it runs)."""


# An evaluator: the value of a sub-expression for one message (None = NULL/unknown).
_Eval = Callable[[MessageContext], Any]


@dataclass(frozen=True)
class _Property:
    system: bool
    name: str  # the service's spelling for system properties, as written for user ones

    @property
    def text(self) -> str:
        return f"sys.{self.name}" if self.system else self.name

    def read(self, message: MessageContext) -> Any:
        if self.system:
            return message.system_property(self.name.lower())
        return message.user_properties.get(self.name)

    def exists(self, message: MessageContext) -> bool:
        if self.system:
            return message.system_property(self.name.lower()) is not None
        return self.name in message.user_properties


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _family(value: Any) -> type:
    """Values of one family compare with each other; numbers (not booleans) form one."""
    if isinstance(value, bool):
        return bool
    if isinstance(value, int | float):
        return float
    for family in (str, datetime, timedelta, uuid.UUID, bytes):
        if isinstance(value, family):
            return family
    return type(value)


_COMPARISONS: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _compare(op: str, left: Any, right: Any) -> bool | None:
    if left is None or right is None or _family(left) is not _family(right):
        return None  # unknown: a missing property, NULL, or values of unrelated types
    if op not in ("=", "<>", "!=") and isinstance(left, bool | uuid.UUID | bytes):
        return None  # these only compare for equality
    try:
        return bool(_COMPARISONS[op](left, right))
    except TypeError:  # e.g. a naive and an aware datetime
        return None


def values_equal(left: Any, right: Any) -> bool:
    """SQL ``=`` between two known values: numbers by value, others of the same family."""
    return _compare("=", left, right) is True


def _arithmetic(op: str, left: Any, right: Any) -> Any:
    if left is None or right is None:
        return None
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    if not (_is_number(left) and _is_number(right)):
        return None
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        return None  # division by zero: unknown, the rule does not match
    if isinstance(left, int) and isinstance(right, int):
        # .NET Int64 semantics: truncate toward zero; the remainder takes the dividend's sign.
        quotient = abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1)
        return quotient if op == "/" else left - quotient * right
    if op == "/":
        return left / right
    return left - right * int(left / right)


def _not(value: Any) -> bool | None:
    return None if value is None else not _truth(value)


def _truth(value: Any) -> bool | None:
    """A value in a boolean position: True, False, or None (unknown)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    return None  # a non-boolean value is neither true nor false


@functools.lru_cache(maxsize=256)
def _like_pattern(pattern: str, escape: str | None) -> re.Pattern[str]:
    parts: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if escape is not None and char == escape:
            parts.append(re.escape(next(chars, "")))
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


def _like(value: Any, pattern: Any, escape: Any) -> bool | None:
    if value is None or pattern is None:
        return None
    if not isinstance(value, str) or not isinstance(pattern, str):
        return None
    if escape is not None and (not isinstance(escape, str) or len(escape) != 1):
        return None
    return _like_pattern(pattern, escape).fullmatch(value) is not None


def _in(value: Any, candidates: list[Any]) -> bool | None:
    if value is None:
        return None
    unknown = False
    for candidate in candidates:
        result = _compare("=", value, candidate)
        if result:
            return True
        unknown = unknown or result is None
    return None if unknown else False


def _constant(value: Any) -> _Eval:
    return lambda _message: value


def _unquote(token: str) -> str:
    if token.startswith("["):
        return token[1:-1].replace("]]", "]")
    if token.startswith('"'):
        return token[1:-1].replace('""', '"')
    return token


class _Compiler(Transformer[Token, Any]):
    """Turns the parse tree into evaluators, checking names and parameters on the way."""

    def __init__(self, parameters: Mapping[str, Any]) -> None:
        super().__init__()
        self._parameters = parameters

    # -- leaves -------------------------------------------------------------------------
    @v_args(inline=True)
    def string(self, token: Token) -> _Eval:
        return _constant(str(token)[1:-1].replace("''", "'"))

    @v_args(inline=True)
    def integer(self, token: Token) -> _Eval:
        return _constant(int(token))

    @v_args(inline=True)
    def decimal(self, token: Token) -> _Eval:
        return _constant(float(token))

    def true(self, _children: list[Any]) -> _Eval:
        return _constant(True)

    def false(self, _children: list[Any]) -> _Eval:
        return _constant(False)

    def null(self, _children: list[Any]) -> _Eval:
        return _constant(None)

    def property(self, children: list[Any]) -> _Property:
        scope, name = (None, children[0]) if len(children) == 1 else children
        name = _unquote(str(name))
        if scope is None or str(scope).lower() == "user":
            return _Property(False, name)
        if str(scope).lower() != "sys":
            raise SqlError(
                f"'{scope}.{name}' has an unknown scope '{scope}': use sys. for system "
                "properties, user. (or nothing) for application properties, or [brackets] "
                "around a name that contains a dot."
            )
        canonical = SYSTEM_PROPERTIES.get(name.lower())
        if canonical is None:
            raise SqlError(
                f"'sys.{name}' is not a system property. Known ones: "
                f"{', '.join(sorted(SYSTEM_PROPERTIES.values()))}."
            )
        return _Property(True, canonical)

    @v_args(inline=True)
    def parameter(self, token: Token) -> _Eval:
        name = str(token)
        for key in (name, name[1:]):
            if key in self._parameters:
                return _constant(self._parameters[key])
        raise SqlError(
            f"The parameter '{name}' has no value: pass it in the rule's parameters, e.g. "
            f"SqlRuleFilter(..., parameters={{'{name}': ...}})."
        )

    def _value(self, node: Any) -> _Eval:
        if isinstance(node, _Property):
            return node.read
        value: _Eval = node
        return value

    # -- expressions --------------------------------------------------------------------
    @v_args(inline=True)
    def function(self, name: Token, argument: Any) -> _Eval:
        lowered = str(name).lower()
        if lowered == "newid" and argument is None:
            return lambda _message: str(uuid.uuid4())
        if lowered == "property" and argument is not None:
            read = self._value(argument)

            def by_name(message: MessageContext) -> Any:
                target = read(message)
                if not isinstance(target, str):
                    return None
                scope, _, rest = target.partition(".")
                if scope.lower() == "sys" and rest.lower() in SYSTEM_PROPERTIES:
                    return message.system_property(rest.lower())
                return message.user_properties.get(rest if scope.lower() == "user" else target)

            return by_name
        raise SqlError(
            f"'{name}(...)' is not a supported function: the filter language has newid() and "
            "property(name)."
        )

    @v_args(inline=True)
    def exists(self, prop: _Property) -> _Eval:
        return prop.exists

    @v_args(inline=True)
    def sign(self, op: Token, operand: Any) -> _Eval:
        read = self._value(operand)
        if op == "+":
            return read
        return lambda message: _arithmetic("-", 0, read(message))

    @v_args(inline=True)
    def arithmetic(self, left: Any, op: Token, right: Any) -> _Eval:
        read_left, read_right, operator = self._value(left), self._value(right), str(op)
        return lambda message: _arithmetic(operator, read_left(message), read_right(message))

    @v_args(inline=True)
    def compare(self, left: Any, op: Token, right: Any) -> _Eval:
        read_left, read_right, operator = self._value(left), self._value(right), str(op)
        return lambda message: _compare(operator, read_left(message), read_right(message))

    @v_args(inline=True)
    def is_null(self, operand: Any) -> _Eval:
        read = self._value(operand)
        return lambda message: read(message) is None

    @v_args(inline=True)
    def is_not_null(self, operand: Any) -> _Eval:
        read = self._value(operand)
        return lambda message: read(message) is not None

    def expr_list(self, children: list[Any]) -> list[_Eval]:
        return [self._value(child) for child in children]

    @v_args(inline=True)
    def in_(self, operand: Any, candidates: list[_Eval]) -> _Eval:
        read = self._value(operand)
        return lambda message: _in(read(message), [c(message) for c in candidates])

    @v_args(inline=True)
    def not_in(self, operand: Any, candidates: list[_Eval]) -> _Eval:
        test = self.in_(operand, candidates)
        return lambda message: _not(test(message))

    @v_args(inline=True)
    def escape(self, escape: Any) -> _Eval | None:
        return None if escape is None else self._value(escape)

    @v_args(inline=True)
    def like(self, operand: Any, pattern: Any, escape: _Eval | None) -> _Eval:
        read, read_pattern = self._value(operand), self._value(pattern)
        read_escape = escape or _constant(None)
        return lambda message: _like(read(message), read_pattern(message), read_escape(message))

    @v_args(inline=True)
    def not_like(self, operand: Any, pattern: Any, escape: _Eval | None) -> _Eval:
        test = self.like(operand, pattern, escape)
        return lambda message: _not(test(message))

    @v_args(inline=True)
    def not_(self, operand: Any) -> _Eval:
        read = self._value(operand)
        return lambda message: _not(read(message))

    @v_args(inline=True)
    def and_(self, left: Any, right: Any) -> _Eval:
        return self._connective(False, left, right)

    @v_args(inline=True)
    def or_(self, left: Any, right: Any) -> _Eval:
        return self._connective(True, left, right)

    def _connective(self, dominant: bool, left: Any, right: Any) -> _Eval:
        """Three-valued AND (``dominant`` False) or OR (True): either side ``dominant``
        decides; otherwise an unknown side makes the result unknown."""
        read_left, read_right = self._value(left), self._value(right)

        def evaluate(message: MessageContext) -> bool | None:
            first = _truth(read_left(message))
            if first is dominant:  # short-circuit, as the result is known
                return dominant
            second = _truth(read_right(message))
            if second is dominant:
                return dominant
            return None if first is None or second is None else not dominant

        return evaluate

    @v_args(inline=True)
    def filter(self, node: Any) -> _Eval:
        return self._value(node)

    # -- actions ------------------------------------------------------------------------
    @v_args(inline=True)
    def set_(self, prop: _Property, _eq: Token, value: Any) -> tuple[_Property, _Eval | None]:
        return prop, self._value(value)

    @v_args(inline=True)
    def remove(self, prop: _Property) -> tuple[_Property, _Eval | None]:
        return prop, None

    def action(self, statements: list[tuple[_Property, _Eval | None]]) -> list[Any]:
        for prop, _ in statements:
            if prop.system:
                raise SqlError(
                    f"SET/REMOVE of the system property '{prop.text}' is not supported by the "
                    "emulator; set or remove application properties (user scope) instead."
                )
        return statements


def _compile(kind: str, expression: str, parameters: Mapping[str, Any] | None) -> Any:
    what = "SqlFilter" if kind == "filter" else "SqlRuleAction"
    if not expression or not expression.strip():
        raise SqlError(f"The {what} expression is empty. {_SYNTAX_HELP}")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise SqlError(
            f"The {what} expression has {len(expression)} characters; the maximum is "
            f"{MAX_EXPRESSION_LENGTH}."
        )
    try:
        tree = _parser().parse(expression, start=kind)
        return _Compiler(parameters or {}).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, SqlError):
            raise SqlError(
                f"The {what} expression '{expression}' is invalid: {exc.orig_exc}"
            ) from None
        raise
    except UnexpectedInput as exc:
        token = str(getattr(exc, "token", ""))
        if isinstance(exc, UnexpectedCharacters):
            found = f"character {exc.char!r}"
        elif token not in ("", "$END"):
            found = f"'{token}'"
        else:
            found = "end of expression"
        raise SqlError(
            f"The {what} expression '{expression}' could not be parsed: unexpected {found} at "
            f"line {exc.line}, column {exc.column}. {_SYNTAX_HELP}"
        ) from None
    except LarkError as exc:
        raise SqlError(f"The {what} expression '{expression}' could not be parsed: {exc}") from None


@dataclass(frozen=True)
class SqlFilter:
    """A compiled ``SqlFilter``; :meth:`matches` is True only when it evaluates to TRUE."""

    expression: str
    _evaluate: _Eval

    def matches(self, message: MessageContext) -> bool:
        return _truth(self._evaluate(message)) is True


def parse_filter(expression: str, parameters: Mapping[str, Any] | None = None) -> SqlFilter:
    """Parse a filter expression, binding its ``@parameters``.

    Args:
        expression: For example ``"color = 'blue' AND quantity > @min"``.
        parameters: Parameter values by name, with or without the leading ``@``.

    Returns:
        The compiled filter.

    Raises:
        SqlError: The expression does not parse, is too long, names an unknown system
            property or function, or uses a parameter without a value.
    """
    return SqlFilter(expression, _compile("filter", expression, parameters))


@dataclass(frozen=True)
class SqlAction:
    """A compiled ``SqlRuleAction``: ``SET``/``REMOVE`` statements run in order."""

    expression: str
    _statements: tuple[tuple[_Property, _Eval | None], ...]

    def apply(self, message: MessageContext) -> tuple[dict[str, Any], set[str]]:
        """Run the statements against ``message``.

        Returns:
            ``(set, removed)``: application properties to set (name -> value) and names to
            remove. A later statement sees the effect of earlier ones.
        """
        changed: dict[str, Any] = {}
        removed: set[str] = set()
        overlay = _Overlay(message, changed, removed)
        for prop, evaluate in self._statements:
            if evaluate is None:
                changed.pop(prop.name, None)
                removed.add(prop.name)
            else:
                changed[prop.name] = evaluate(overlay)
                removed.discard(prop.name)
        return changed, removed


class _Overlay:
    """A message as an action sees it part-way: its properties with the edits so far."""

    def __init__(self, message: MessageContext, changed: dict[str, Any], removed: set[str]):
        self._message = message
        self._changed = changed
        self._removed = removed

    def system_property(self, name: str) -> Any:
        return self._message.system_property(name)

    @property
    def user_properties(self) -> Mapping[str, Any]:
        merged = {k: v for k, v in self._message.user_properties.items() if k not in self._removed}
        merged.update(self._changed)
        return merged


def parse_action(expression: str, parameters: Mapping[str, Any] | None = None) -> SqlAction:
    """Parse a rule action (``SET a = expr; REMOVE b``), binding its ``@parameters``.

    Raises:
        SqlError: As :func:`parse_filter`; also for ``SET``/``REMOVE`` of a system property,
            which the emulator does not implement.
    """
    return SqlAction(expression, tuple(_compile("action", expression, parameters)))
