"""The emulator's rule language (``_sql``), rule sets (``_rules``) and the topic fan-out that
applies them (``_broker``): no network, no clock but an injected one."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _emulator_parts import Clock

from georep.adapters.emulator._broker import EntityProperties, Namespace
from georep.adapters.emulator._codec import (
    SECTION_APPLICATION_PROPERTIES,
    decode_value,
    encode_value,
    section_value_start,
    split_sections,
)
from georep.adapters.emulator._rules import (
    InvalidRuleError,
    Rule,
    RuleAction,
    RuleExistsError,
    RuleFilter,
    RuleNotFoundError,
    RuleSet,
)
from georep.adapters.emulator._sql import SqlError, parse_action, parse_filter


class Message:
    """A message as filters see it: system properties by lower-case name, user properties."""

    def __init__(self, user: Mapping[str, Any] | None = None, **system: Any) -> None:
        self.user_properties = dict(user or {})
        self._system = {name.replace("_", ""): value for name, value in system.items()}

    def system_property(self, name: str) -> Any:
        return self._system.get(name)


ORDER = Message(
    {"color": "blue", "quantity": 10, "price": 2.5, "urgent": True, "note": None, "code": "a_b%"},
    label="order-7",
    message_id="m-1",
    sequence_number=42,
)


def matches(expression: str, message: Message = ORDER, **parameters: Any) -> bool:
    return parse_filter(expression, parameters).matches(message)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("color = 'blue'", True),
        ("color = 'red'", False),
        ("color <> 'red'", True),
        ("color != 'blue'", False),
        ("quantity > 9", True),
        ("quantity >= 10", True),
        ("quantity < 10", False),
        ("quantity <= 10", True),
        ("price > 2", True),  # long and double compare by value
        ("quantity = 10.0", True),
        ("urgent = TRUE", True),
        ("urgent", True),  # a boolean property is a predicate
        ("1=1", True),
        ("1>1", False),
        ("quantity + 5 = 15", True),
        ("quantity - 15 = -5", True),
        ("quantity * 2 = 20", True),
        ("quantity / 4 = 2", True),  # integer division, as Int64
        ("-7 / 2 = -3", True),  # truncates toward zero
        ("quantity % 3 = 1", True),
        ("-7 % 3 = -1", True),  # the remainder has the dividend's sign
        ("price / 2 = 1.25", True),
        ("2 + 3 * 4 = 14", True),  # precedence
        ("(2 + 3) * 4 = 20", True),
        ("-quantity = -10", True),
        ("1.5e1 = 15", True),
        ("'it''s' = 'it''s'", True),  # doubled quote inside a string
        ("color IN ('red', 'blue')", True),
        ("color NOT IN ('red', 'green')", True),
        ("quantity IN (1, 2)", False),
        ("color LIKE 'bl%'", True),
        ("color LIKE 'b_ue'", True),
        ("color LIKE 'B%'", False),  # case-sensitive
        ("color NOT LIKE '%e'", False),
        ("code LIKE 'a!_b!%' ESCAPE '!'", True),
        ("code LIKE 'a!_c%' ESCAPE '!'", False),
        ("EXISTS(color)", True),
        ("EXISTS(note)", True),  # present with a null value
        ("EXISTS(missing)", False),
        ("note IS NULL", True),
        ("missing IS NULL", True),
        ("color IS NOT NULL", True),
        ("color = 'blue' AND quantity > 5", True),
        ("color = 'red' OR quantity > 5", True),
        ("NOT color = 'red'", True),
        ("sys.Label = 'order-7'", True),
        ("sys.label LIKE 'order-%'", True),  # system names are case-insensitive
        ("sys.MessageId = 'm-1' AND sys.SequenceNumber = 42", True),
        ("sys.CorrelationId IS NULL", True),  # unset system property: null
        ("user.color = 'blue'", True),
        ("[color] = 'blue'", True),
        ("\"color\" = 'blue'", True),
        ("color = 'blue' and QUANTITY > 1", False),  # keywords any case; names are not
        ("property('sys.Label') = 'order-7'", True),
        ("property('color') = 'blue'", True),
        ("newid() IS NOT NULL", True),
    ],
)
def test_operators(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


@pytest.mark.parametrize(
    "expression",
    [
        "missing = 1",
        "missing <> 1",  # unknown, not true
        "NOT missing = 1",  # NOT unknown is unknown
        "missing + 1 = 2",
        "missing LIKE 'a%'",
        "missing IN (1, 2)",
        "missing NOT IN (1, 2)",
        "missing = 1 AND 1 = 1",
        "missing = 1 OR 1 = 2",
        "note = NULL",  # nothing equals NULL
        "color = 1",  # a string and a number: unknown
        "quantity / 0 = 1",  # division by zero: unknown
        "color",  # a string is not a predicate
    ],
)
def test_unknown_never_matches(expression: str) -> None:
    assert matches(expression) is False


def test_three_valued_and_or() -> None:
    # FALSE AND unknown is FALSE, TRUE OR unknown is TRUE: so their negations differ.
    assert matches("NOT (missing = 1 AND 1 = 2)") is True
    assert matches("NOT (missing = 1 OR 1 = 2)") is False
    assert matches("missing = 1 OR 1 = 1") is True
    assert matches("quantity IN (1, missing)") is False
    assert matches("NOT (quantity IN (1, missing))") is False  # unknown: one candidate is null
    assert matches("NOT (quantity IN (10, missing))") is False  # true: it is 10


def test_parameters_with_or_without_the_at_sign() -> None:
    assert matches("quantity > @min AND color = @color", min=5, color="blue") is True
    assert parse_filter("quantity > @min", {"@min": 50}).matches(ORDER) is False
    when = datetime(2024, 1, 1, tzinfo=UTC)
    message = Message({"due": when + timedelta(days=1)})
    assert parse_filter("due > @when", {"@when": when}).matches(message) is True


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("color =", "could not be parsed: unexpected end of expression"),
        ("color == 'blue'", "unexpected '='"),
        ("'open", "unexpected character"),
        ("sys.Lable = 'x'", "'sys.Lable' is not a system property"),
        ("other.color = 'x'", "unknown scope 'other'"),
        ("color = @missing", "The parameter '@missing' has no value"),
        ("upper(color) = 'X'", "'upper(...)' is not a supported function"),
        ("", "is empty"),
        ("a = '" + "x" * 1100 + "'", "the maximum is 1024"),
    ],
)
def test_invalid_filters_are_refused_with_the_reason(expression: str, reason: str) -> None:
    with pytest.raises(SqlError, match="SqlFilter") as refused:
        parse_filter(expression)
    assert reason in str(refused.value)


def test_action_sets_and_removes_in_order() -> None:
    action = parse_action(
        "SET total = quantity * @factor; SET label = sys.Label; SET doubled = total * 2; "
        "REMOVE color; SET color2 = color;",
        {"@factor": 3},
    )
    changes, removed = action.apply(ORDER)
    # A statement sees the effect of the ones before it: color is gone, so color2 is null.
    assert changes == {"total": 30, "label": "order-7", "doubled": 60, "color2": None}
    assert removed == {"color"}
    assert ORDER.user_properties["color"] == "blue"  # the message itself is not modified
    # Semicolons between statements are optional, as the service's grammar says.
    assert parse_action("SET a = 1 SET b = a + 1 REMOVE c").apply(ORDER) == (
        {"a": 1, "b": 2},
        {"c"},
    )


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("SET = 1", "could not be parsed"),
        ("SET a 1", "could not be parsed"),
        ("DELETE a", "could not be parsed"),
        ("SET sys.Label = 'x'", "system property 'sys.Label' is not supported"),
        ("SET a = @p", "'@p' has no value"),
    ],
)
def test_invalid_actions_are_refused(expression: str, reason: str) -> None:
    with pytest.raises(SqlError, match="SqlRuleAction") as refused:
        parse_action(expression)
    assert reason in str(refused.value)


# -- rule sets --------------------------------------------------------------------------------
def test_correlation_filter_needs_every_given_field() -> None:
    rule_filter = RuleFilter.correlation_filter(
        {"label": "order-7", "message_id": "m-1"}, {"quantity": 10}
    )
    assert rule_filter.matches(ORDER) is True
    assert RuleFilter.correlation_filter({"label": "order-8"}).matches(ORDER) is False
    assert RuleFilter.correlation_filter({}, {"quantity": 11}).matches(ORDER) is False
    assert RuleFilter.correlation_filter({}, {"missing": 1}).matches(ORDER) is False
    with pytest.raises(InvalidRuleError, match="at least one"):
        RuleFilter.correlation_filter({"label": None})


def test_rule_set_crud_is_case_insensitive_and_refuses_like_the_service() -> None:
    rules = RuleSet.with_default(created_at=5.0)
    assert [(r.name, r.filter.kind, r.created_at) for r in rules] == [
        ("$Default", "TrueFilter", 5.0)
    ]
    rules.add(Rule("Orders", RuleFilter.sql("a = 1")))
    with pytest.raises(RuleExistsError):
        rules.add(Rule("orders", RuleFilter.true()))
    replaced = rules.replace(Rule("ORDERS", RuleFilter.false(), created_at=99.0))
    assert (replaced.name, replaced.filter.kind, replaced.created_at) == (
        "Orders",
        "FalseFilter",
        0.0,
    )
    rules.remove("$default")
    with pytest.raises(RuleNotFoundError):
        rules.remove("$Default")
    with pytest.raises(RuleNotFoundError):
        rules.replace(Rule("nope", RuleFilter.true()))
    with pytest.raises(InvalidRuleError, match="rule name"):
        Rule("x" * 51, RuleFilter.true())
    with pytest.raises(InvalidRuleError, match="could not be parsed"):
        RuleFilter.sql("a = ")


def test_route_one_plain_copy_for_rules_without_actions_and_one_per_action_rule() -> None:
    rules = RuleSet(
        [
            Rule("$Default", RuleFilter.true()),
            Rule("blue", RuleFilter.sql("color = 'blue'")),
            Rule("tag", RuleFilter.sql("quantity > 1"), RuleAction.sql("SET tag = 1; REMOVE note")),
            Rule("never", RuleFilter.false(), RuleAction.sql("SET never = 1")),
        ]
    )
    copies = rules.route(lambda: ORDER)
    assert [(c.rule_name, dict(c.changes), c.removed) for c in copies] == [
        (None, {}, frozenset()),
        ("tag", {"tag": 1, "RuleName": "tag"}, frozenset({"note"})),
    ]
    assert RuleSet([Rule("never", RuleFilter.false())]).route(lambda: ORDER) == []


def test_a_lone_default_rule_does_not_decode_the_message() -> None:
    def never() -> Message:
        raise AssertionError("the message was decoded")

    assert len(RuleSet.with_default(0.0).route(never)) == 1


# -- fan-out ----------------------------------------------------------------------------------
def _message(app: dict[str, Any], subject: str | None = None) -> bytes:
    properties = [f"id-{subject}", None, None, subject]
    return (
        b"\x00\x53\x73"
        + encode_value(properties)
        + b"\x00\x53\x74"
        + encode_value(app)
        + b"\x00\x53\x75"
        + encode_value(b"body")
    )


def _application_properties(bare: bytes) -> dict[str, Any]:
    for code, start, _ in split_sections(bare):
        if code == SECTION_APPLICATION_PROPERTIES:
            value: dict[str, Any] = decode_value(bare, section_value_start(bare, start))[0]
            return value
    return {}


@pytest.mark.parametrize("partitioned", [False, True])
def test_fan_out_applies_each_subscriptions_rules(partitioned: bool) -> None:
    ns = Namespace("primary", clock=Clock())
    topic = ns.create_topic("t", EntityProperties(enable_partitioning=partitioned))
    everything = ns.create_subscription("t", "all")
    red = ns.create_subscription("t", "red")
    red_rules = topic.rules["red"]
    red_rules.remove("$Default")
    red_rules.add(
        Rule(
            "red",
            RuleFilter.sql("color = 'red' AND sys.Label = 'paint'"),
            RuleAction.sql("SET x = 1"),
        )
    )
    ns.send(topic, _message({"color": "red", "keep": "k"}, subject="paint"))
    ns.send(topic, _message({"color": "blue"}, subject="paint"))
    ns.send(topic, _message({"color": "red"}, subject="other"))

    assert len(everything.available) == 3
    assert all(_application_properties(m.bare).get("x") is None for m in everything.available)
    [copy] = red.available
    assert _application_properties(copy.bare) == {
        "color": "red",
        "keep": "k",
        "x": 1,
        "RuleName": "red",
    }
    assert copy.sequence_number == everything.available[0].sequence_number


def test_a_recreated_subscription_starts_again_with_only_the_default_rule() -> None:
    ns = Namespace("primary", clock=Clock())
    topic = ns.create_topic("t")
    ns.create_subscription("t", "s")
    topic.rules["s"].add(Rule("extra", RuleFilter.false()))
    topic.subscriptions.pop("s")
    ns.create_subscription("t", "s")
    assert [r.name for r in topic.rules["s"]] == ["$Default"]
