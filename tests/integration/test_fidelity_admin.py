"""Fidelity: administration, rules and filters: rows of the
fidelity table in docs/emulator.md (see ``_fidelity.py``)."""

from __future__ import annotations

import pytest
from _fidelity import (
    bodies,
    check,
    checks_test,
    client_for,
    receive_all,
    unique_name,
)
from azure.servicebus import (
    ServiceBusMessage,
)
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


# -- administration -------------------------------------------------------------------------
@check("Admin: queue create, get, update, list, runtime properties, delete")
def _admin_queue(emu: Emulator) -> None:
    name = unique_name("adq")
    with emu.admin_client("primary") as admin:
        admin.create_queue(name, max_delivery_count=7)
        queue = admin.get_queue(name)
        assert queue.max_delivery_count == 7
        queue.max_delivery_count = 9
        admin.update_queue(queue)
        assert admin.get_queue(name).max_delivery_count == 9
        assert name in [q.name for q in admin.list_queues()]
        assert admin.get_queue_runtime_properties(name).total_message_count == 0
        admin.delete_queue(name)
        assert name not in [q.name for q in admin.list_queues()]


@check("Admin: topic and subscription create, get, list, delete")
def _admin_topic(emu: Emulator) -> None:
    topic = unique_name("adt")
    with emu.admin_client("primary") as admin:
        admin.create_topic(topic)
        admin.create_subscription(topic, "s1", max_delivery_count=4)
        assert admin.get_subscription(topic, "s1").max_delivery_count == 4
        assert [s.name for s in admin.list_subscriptions(topic)] == ["s1"]
        admin.delete_subscription(topic, "s1")
        admin.delete_topic(topic)
        assert topic not in [t.name for t in admin.list_topics()]


# -- rules and filters ---------------------------------------------------------------------
@check("Admin: rule create, get, list, update, delete (`$Default` too)")
def _admin_rules(emu: Emulator) -> None:
    topic = unique_name("rt")
    emu.namespace("primary").create_topic(topic, ["s"])
    with emu.admin_client("primary") as admin:
        assert [r.name for r in admin.list_rules(topic, "s")] == ["$Default"]
        admin.create_rule(topic, "s", "red", filter=SqlRuleFilter("color = 'red'"))
        rule = admin.get_rule(topic, "s", "red")
        assert isinstance(rule.filter, SqlRuleFilter)
        rule.filter = SqlRuleFilter("color = 'blue'")
        admin.update_rule(topic, "s", rule)
        assert admin.get_rule(topic, "s", "red").filter.sql_expression == "color = 'blue'"
        admin.delete_rule(topic, "s", "$Default")
        assert [r.name for r in admin.list_rules(topic, "s")] == ["red"]
        admin.delete_rule(topic, "s", "red")
        assert list(admin.list_rules(topic, "s")) == []


@check("Subscription filters: SQL, correlation, true and false")
def _filters(emu: Emulator) -> None:
    topic = unique_name("ft")
    emu.namespace("primary").create_topic(topic, ["sql", "corr", "none"])
    with emu.admin_client("primary") as admin:
        rules = {
            "sql": SqlRuleFilter("size > @min AND sys.Label LIKE 'ord%'", parameters={"@min": 5}),
            "corr": CorrelationRuleFilter(correlation_id="c-1", properties={"tier": "gold"}),
            "none": FalseRuleFilter(),
        }
        for subscription, rule_filter in rules.items():
            admin.delete_rule(topic, subscription, "$Default")
            admin.create_rule(topic, subscription, "only", filter=rule_filter)
    with client_for(emu) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(b"big", subject="ord", application_properties={"size": 9}),
                    ServiceBusMessage(b"small", subject="ord", application_properties={"size": 1}),
                    ServiceBusMessage(
                        b"gold", correlation_id="c-1", application_properties={"tier": "gold"}
                    ),
                ]
            )
        expected = {"sql": [b"big"], "corr": [b"gold"], "none": []}
        for subscription, wanted in expected.items():
            with client.get_subscription_receiver(topic, subscription) as receiver:
                got = receive_all(receiver, len(wanted), within=3)
                assert bodies(got) == wanted, subscription
                assert receiver.receive_messages(max_wait_time=0.3) == []


@check("`SqlRuleAction` (`SET`, `REMOVE`) on the subscription's copy")
def _rule_action(emu: Emulator) -> None:
    topic = unique_name("at")
    emu.namespace("primary").create_topic(topic, ["tagged", "plain"])
    with emu.admin_client("primary") as admin:
        admin.delete_rule(topic, "tagged", "$Default")
        admin.create_rule(
            topic,
            "tagged",
            "tag",
            filter=TrueRuleFilter(),
            action=SqlRuleAction("SET routed = 'yes'; REMOVE secret"),
        )
    message = ServiceBusMessage(b"m", application_properties={"secret": "s", "keep": 1})
    with client_for(emu) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(message)
        with client.get_subscription_receiver(topic, "tagged") as receiver:
            [tagged] = receive_all(receiver, 1)
            props = tagged.application_properties
            assert props[b"routed"] == b"yes" and b"secret" not in props and props[b"keep"] == 1
        with client.get_subscription_receiver(topic, "plain") as receiver:
            [plain] = receive_all(receiver, 1)
            assert b"routed" not in plain.application_properties
            assert plain.application_properties[b"secret"] == b"s"


test_supported_operation_works = checks_test(__name__)
