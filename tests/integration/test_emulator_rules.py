"""Subscription rules and filters through the real SDK: the admin client manages rules, and a
topic delivers each message only to the subscriptions whose rules match it, with the actions
applied. Sync and async, written as the SDK's samples write them."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _properties(message: ServiceBusReceivedMessage) -> dict[str, Any]:
    # The SDK hands application property keys (and string values) back as bytes.
    def text(value: Any) -> Any:
        return value.decode() if isinstance(value, bytes) else value

    return {text(k): text(v) for k, v in (message.application_properties or {}).items()}


def _orders() -> list[ServiceBusMessage]:
    return [
        ServiceBusMessage(
            "m1",
            subject="order",
            application_properties={"region": "eu", "quantity": 10, "color": "red", "temp": 1},
        ),
        ServiceBusMessage(
            "m2",
            subject="order",
            application_properties={"region": "us", "quantity": 3, "color": "blue"},
        ),
        # No quantity: the SQL filter's comparison is unknown, so it does not match.
        ServiceBusMessage("m3", subject="refund", application_properties={"region": "eu"}),
    ]


def _drain(client: ServiceBusClient, topic: str, subscription: str) -> list[Any]:
    received = []
    with client.get_subscription_receiver(topic, subscription) as receiver:
        while batch := receiver.receive_messages(max_message_count=10, max_wait_time=1):
            for message in batch:
                receiver.complete_message(message)
                received.append(message)
    return received


async def _async_drain(client: AsyncServiceBusClient, topic: str, subscription: str) -> list[Any]:
    received = []
    async with client.get_subscription_receiver(topic, subscription) as receiver:
        while batch := await receiver.receive_messages(max_message_count=10, max_wait_time=1):
            for message in batch:
                await receiver.complete_message(message)
                received.append(message)
    return received


async def test_async_topic_routes_by_true_false_correlation_and_sql_filters(
    georep_emulator: Emulator,
) -> None:
    topic = _name("rules-async")
    async with georep_emulator.async_admin_client("primary") as admin:
        await admin.create_topic(topic)
        for subscription in ("all", "none", "eu-orders", "big-orders"):
            await admin.create_subscription(topic, subscription)
        # "all" keeps its $Default rule; the others replace it.
        for subscription in ("none", "eu-orders", "big-orders"):
            await admin.delete_rule(topic, subscription, "$Default")
        await admin.create_rule(topic, "none", "never", filter=FalseRuleFilter())
        await admin.create_rule(
            topic,
            "eu-orders",
            "eu",
            filter=CorrelationRuleFilter(label="order", properties={"region": "eu"}),
        )
        big = SqlRuleFilter("quantity > @min AND color IN ('red', 'blue')", parameters={"@min": 5})
        rewrite = SqlRuleAction("SET priority = 'high'; SET total = quantity * 2; REMOVE temp")
        await admin.create_rule(topic, "big-orders", "big", filter=big, action=rewrite)
        with pytest.raises(HttpResponseError) as refused:
            await admin.create_rule(topic, "all", "broken", filter=SqlRuleFilter("quantity >"))
        assert refused.value.status_code == 400
        assert "could not be parsed" in str(refused.value)
        rules = [rule.name async for rule in admin.list_rules(topic, "all")]
        assert rules == ["$Default"]  # the refused rule was not stored

    async with AsyncServiceBusClient.from_connection_string(
        georep_emulator.connection_string("primary")
    ) as client:
        async with client.get_topic_sender(topic) as sender:
            await sender.send_messages(_orders())
        got = {
            subscription: await _async_drain(client, topic, subscription)
            for subscription in ("all", "none", "eu-orders", "big-orders")
        }

    assert sorted(str(m) for m in got["all"]) == ["m1", "m2", "m3"]
    assert got["none"] == []
    assert [str(m) for m in got["eu-orders"]] == ["m1"]
    assert [str(m) for m in got["big-orders"]] == ["m1"]
    # The action rewrote this subscription's copy only, and names the rule that made it.
    assert _properties(got["big-orders"][0]) == {
        "region": "eu",
        "quantity": 10,
        "color": "red",
        "priority": "high",
        "total": 20,
        "RuleName": "big",
    }
    assert _properties(got["eu-orders"][0])["temp"] == 1


def test_sync_rule_crud_and_bad_sql_is_refused(georep_emulator: Emulator) -> None:
    topic = _name("rules-crud")
    with georep_emulator.admin_client("primary") as admin:
        admin.create_topic(topic)
        admin.create_subscription(topic, "audit")
        default = admin.get_rule(topic, "audit", "$Default")
        assert isinstance(default.filter, TrueRuleFilter) and default.action is None

        priced = SqlRuleFilter(
            "price >= @floor AND sys.Label LIKE 'inv!_%' ESCAPE '!'", parameters={"@floor": 9.5}
        )
        checked = SqlRuleAction("SET checked = TRUE")
        created = admin.create_rule(topic, "audit", "priced", filter=priced, action=checked)
        assert created.name == "priced" and created.created_at_utc is not None
        fetched = admin.get_rule(topic, "audit", "priced")
        assert isinstance(fetched.filter, SqlRuleFilter)
        assert fetched.filter.sql_expression.startswith("price >= @floor")
        assert fetched.filter.parameters == {"@floor": 9.5}
        assert isinstance(fetched.action, SqlRuleAction)
        assert fetched.action.sql_expression == "SET checked = TRUE"
        with pytest.raises(ResourceExistsError):
            admin.create_rule(topic, "audit", "priced")

        fetched.filter = CorrelationRuleFilter(correlation_id="c-1", properties={"tier": 2})
        admin.update_rule(topic, "audit", fetched)
        updated = admin.get_rule(topic, "audit", "priced")
        assert isinstance(updated.filter, CorrelationRuleFilter)
        assert (updated.filter.correlation_id, updated.filter.properties) == ("c-1", {"tier": 2})

        with pytest.raises(HttpResponseError) as refused:
            admin.create_rule(topic, "audit", "typo", filter=SqlRuleFilter("sys.Lable = 'x'"))
        assert refused.value.status_code == 400
        assert "'sys.Lable' is not a system property" in str(refused.value)
        with pytest.raises(HttpResponseError):
            admin.create_rule(topic, "audit", "bad-action", action=SqlRuleAction("SET = 1"))

        admin.delete_rule(topic, "audit", "$Default")
        assert [rule.name for rule in admin.list_rules(topic, "audit")] == ["priced"]
        with pytest.raises(ResourceNotFoundError):
            admin.get_rule(topic, "audit", "$Default")
        with pytest.raises(ResourceNotFoundError):
            admin.delete_rule(topic, "audit", "$Default")
        with pytest.raises(ResourceNotFoundError):
            admin.update_rule(topic, "audit", default)
        with pytest.raises(ResourceNotFoundError):
            admin.create_rule(topic, "missing-subscription", "r")
        admin.delete_topic(topic)


def test_sync_each_matching_rule_with_an_action_makes_its_own_copy(
    georep_emulator: Emulator,
) -> None:
    topic = _name("rules-copies")
    with georep_emulator.admin_client("primary") as admin:
        admin.create_topic(topic)
        admin.create_subscription(topic, "audit")  # keeps $Default: TRUE, no action
        admin.create_rule(topic, "audit", "also-true", filter=SqlRuleFilter("1=1"))
        for tag, condition in (("a", "EXISTS(a)"), ("b", "b = 1")):
            tagging = SqlRuleAction(f"SET tag = '{tag}'")
            admin.create_rule(
                topic, "audit", f"tag-{tag}", filter=SqlRuleFilter(condition), action=tagging
            )

    with ServiceBusClient.from_connection_string(
        georep_emulator.connection_string("primary")
    ) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(ServiceBusMessage("both", application_properties={"a": 0, "b": 1}))
            sender.send_messages(ServiceBusMessage("only-b", application_properties={"b": 1}))
        received = _drain(client, topic, "audit")

    copies = [(str(m), _properties(m).get("RuleName"), _properties(m).get("tag")) for m in received]
    # Rules without an action give one plain copy between them; each action rule its own.
    assert sorted(copies, key=repr) == sorted(
        [
            ("both", None, None),
            ("both", "tag-a", "a"),
            ("both", "tag-b", "b"),
            ("only-b", None, None),
            ("only-b", "tag-b", "b"),
        ],
        key=repr,
    )
    assert len({m.sequence_number for m in received}) == len(received)


async def test_async_filters_apply_on_partitioned_topics(georep_emulator: Emulator) -> None:
    topic = _name("rules-partitioned")
    async with georep_emulator.async_admin_client("secondary") as admin:
        await admin.create_topic(topic, enable_partitioning=True, max_size_in_megabytes=1024)
        await admin.create_subscription(topic, "red")
        await admin.delete_rule(topic, "red", "$Default")
        await admin.create_rule(topic, "red", "red", filter=SqlRuleFilter("color = 'red'"))

    async with AsyncServiceBusClient.from_connection_string(
        georep_emulator.connection_string("secondary")
    ) as client:
        async with client.get_topic_sender(topic) as sender:
            for key in ("k1", "k2", "k3"):
                for color in ("red", "blue"):
                    await sender.send_messages(
                        ServiceBusMessage(
                            f"{color}-{key}",
                            partition_key=key,
                            application_properties={"color": color},
                        )
                    )
        received = await _async_drain(client, topic, "red")
    assert sorted(str(m) for m in received) == ["red-k1", "red-k2", "red-k3"]


def test_sync_filters_read_the_system_properties_the_sdk_sets(georep_emulator: Emulator) -> None:
    topic = _name("rules-sys")
    with georep_emulator.admin_client("primary") as admin:
        admin.create_topic(topic)
        admin.create_subscription(topic, "replies")
        admin.delete_rule(topic, "replies", "$Default")
        admin.create_rule(
            topic,
            "replies",
            "json-replies",
            filter=SqlRuleFilter(
                "sys.CorrelationId = 'c-1' AND sys.ContentType = 'application/json' "
                "AND sys.To = 'billing' AND sys.ReplyTo = 'inbox' AND sys.MessageId LIKE 'r-%' "
                "AND sys.TimeToLive < @limit AND sys.SequenceNumber > 0",
                parameters={"@limit": timedelta(minutes=5)},
            ),
        )

    def reply(message_id: str, **overrides: Any) -> ServiceBusMessage:
        fields: dict[str, Any] = {
            "correlation_id": "c-1",
            "content_type": "application/json",
            "to": "billing",
            "reply_to": "inbox",
            "time_to_live": timedelta(minutes=1),
        }
        return ServiceBusMessage(message_id, message_id=message_id, **(fields | overrides))

    with ServiceBusClient.from_connection_string(
        georep_emulator.connection_string("primary")
    ) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(reply("r-match"))
            sender.send_messages(reply("r-other-correlation", correlation_id="c-2"))
            sender.send_messages(reply("r-long-ttl", time_to_live=timedelta(hours=1)))
            sender.send_messages(reply("x-wrong-id"))
        received = _drain(client, topic, "replies")
    assert [m.message_id for m in received] == ["r-match"]


async def test_async_an_updated_rule_routes_the_next_messages(georep_emulator: Emulator) -> None:
    topic = _name("rules-update")
    async with georep_emulator.async_admin_client("primary") as admin:
        await admin.create_topic(topic)
        await admin.create_subscription(topic, "us")
        await admin.delete_rule(topic, "us", "$Default")
        await admin.create_rule(topic, "us", "gate", filter=FalseRuleFilter())
        async with AsyncServiceBusClient.from_connection_string(
            georep_emulator.connection_string("primary")
        ) as client:
            async with client.get_topic_sender(topic) as sender:
                await sender.send_messages(_orders())
                assert await _async_drain(client, topic, "us") == []

                rule = await admin.get_rule(topic, "us", "gate")
                assert isinstance(rule.filter, FalseRuleFilter)
                rule.filter = SqlRuleFilter("region = 'us'")
                await admin.update_rule(topic, "us", rule)
                assert (await admin.get_rule(topic, "us", "gate")).filter.sql_expression == (
                    "region = 'us'"
                )
                await sender.send_messages(_orders())
            received = await _async_drain(client, topic, "us")
        assert [str(m) for m in received] == ["m2"]
        await admin.delete_rule(topic, "us", "gate")
        assert [rule async for rule in admin.list_rules(topic, "us")] == []
