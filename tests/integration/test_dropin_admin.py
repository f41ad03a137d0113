"""The drop-in ServiceBusAdministrationClient (sync and async): every create, update and
delete lands in both namespaces; gets and lists say where the namespaces differ; an
admin program prints the same on the raw SDK (one namespace) and on georep's (two)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus.management import ServiceBusAdministrationClient as SdkAdmin, SqlRuleFilter

from georep.adapters.emulator import Emulator
from georep.servicebus.aio.management import ServiceBusAdministrationClient as AsyncAdmin
from georep.servicebus.management import ServiceBusAdministrationClient

pytestmark = pytest.mark.integration

REGIONS = ("primary", "secondary")


def georep_admin(emu: Emulator) -> ServiceBusAdministrationClient:
    """The one changed line (and the emulator's certificate)."""
    return ServiceBusAdministrationClient.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        connection_verify=str(emu.ca_file),
    )


def manage(admin: Any, tag: str) -> list[str]:
    """An administration program as SDK samples write one; what it printed, by line."""
    out: list[str] = []
    queue, topic = f"mq-{tag}", f"mt-{tag}"
    admin.create_queue(queue, lock_duration=timedelta(seconds=20), max_delivery_count=5)
    properties = admin.get_queue(queue)
    out.append(f"{properties.name} {properties.lock_duration} {properties.max_delivery_count}")
    properties.max_delivery_count = 7
    admin.update_queue(properties)
    out.append(f"updated {admin.get_queue(queue).max_delivery_count}")
    out.append(f"listed {sorted(q.name for q in admin.list_queues() if q.name == queue)}")
    admin.create_topic(topic)
    admin.create_subscription(topic, "audit")
    admin.create_rule(topic, "audit", "big", filter=SqlRuleFilter("amount > 100"))
    out.append(f"rules {sorted(r.name for r in admin.list_rules(topic, 'audit'))}")
    out.append(f"runtime {admin.get_queue_runtime_properties(queue).active_message_count}")
    admin.delete_rule(topic, "audit", "big")
    admin.delete_subscription(topic, "audit")
    admin.delete_topic(topic)
    admin.delete_queue(queue)
    try:
        admin.get_queue(queue)
    except ResourceNotFoundError:
        out.append("deleted")
    return out


def raw_admin(emu: Emulator, region: str) -> SdkAdmin:
    return SdkAdmin.from_connection_string(
        emu.connection_string(region), connection_verify=str(emu.ca_file)
    )


def entities(emu: Emulator, region: str) -> set[str]:
    return set(emu.namespace(region).entities())


def test_an_admin_program_prints_the_same_over_two_namespaces(emu: Emulator) -> None:
    tag = uuid.uuid4().hex[:8]
    with raw_admin(emu, "primary") as raw:
        expected = manage(raw, f"raw{tag}")
    with georep_admin(emu) as admin:
        output = manage(admin, tag)

    assert output == [line.replace(f"raw{tag}", tag) for line in expected]
    for region in REGIONS:
        assert not {e for e in entities(emu, region) if tag in e}, region


def test_every_change_lands_in_both_and_gets_say_where_they_differ(emu: Emulator) -> None:
    queue = f"dq-{uuid.uuid4().hex[:8]}"
    with georep_admin(emu) as admin:
        admin.create_queue(queue, max_delivery_count=5)
        for region in REGIONS:
            with raw_admin(emu, region) as raw:
                assert raw.get_queue(queue).max_delivery_count == 5, region

        with raw_admin(emu, "secondary") as raw:  # someone changed one region by hand
            drifted = raw.get_queue(queue)
            drifted.max_delivery_count = 9
            raw.update_queue(drifted)
        properties = admin.get_queue(queue)
        assert properties.max_delivery_count == 5
        assert properties.georep_differences == {
            "max_delivery_count": {"primary": 5, "secondary": 9}
        }
        admin.update_queue(properties)  # the primary's settings, applied to both
        assert admin.get_queue(queue).georep_differences == {}

        with raw_admin(emu, "secondary") as raw:
            raw.create_queue(f"{queue}-only")
        listed = {q.name: q for q in admin.list_queues()}
        assert set(listed[queue].georep_regions) == set(REGIONS)
        # As SDK code reads the SDK's ItemPaged: by pages too.
        paged = [q.name for page in admin.list_queues().by_page() for q in page]
        assert sorted(paged) == sorted(listed)
        assert set(listed[f"{queue}-only"].georep_regions) == {"secondary"}
        admin.create_queue(f"{queue}-only")  # there already in the secondary: made in the primary
        assert f"{queue}-only" in entities(emu, "primary")

        admin.delete_queue(queue)
        admin.delete_queue(f"{queue}-only")
        with pytest.raises(ResourceNotFoundError):
            admin.delete_queue(queue)
    for region in REGIONS:
        assert queue not in entities(emu, region) and f"{queue}-only" not in entities(emu, region)


async def test_the_async_client_applies_changes_to_both(emu: Emulator) -> None:
    topic = f"at-{uuid.uuid4().hex[:8]}"
    admin = AsyncAdmin.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        connection_verify=str(emu.ca_file),
    )
    async with admin:
        await admin.create_topic(topic)
        await admin.create_subscription(topic, "s", max_delivery_count=4)
        subscription = await admin.get_subscription(topic, "s")
        assert subscription.georep_differences == {}
        assert [s.name for s in await admin.list_subscriptions(topic)] == ["s"]
        await admin.create_rule(topic, "s", "eu", filter=SqlRuleFilter("region = 'eu'"))
        rules = {r.name: r for r in await admin.list_rules(topic, "s")}
        assert set(rules["eu"].georep_regions) == set(REGIONS)
        # As SDK code reads the async SDK's AsyncItemPaged: async for, and by pages.
        assert sorted([r.name async for r in admin.list_rules(topic, "s")]) == ["$Default", "eu"]
        pages = [[q.name async for q in page] async for page in admin.list_topics().by_page()]
        assert any(topic in page for page in pages)
        for region in REGIONS:
            assert f"{topic}/Subscriptions/s" in entities(emu, region), region
        await admin.delete_topic(topic)
    for region in REGIONS:
        assert topic not in entities(emu, region)
