"""`georep status`, `failover`, `failback`, `pin`, `unpin` and `forget` against a real Redis."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from _helpers import LOADED, REDIS_URL, run_python
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from typer.testing import CliRunner

from georep import GeoSender, PairedNamespaceOptions
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisRoleStore, RedisSeenSet
from georep.adapters.servicebus import ensure_backlog_queues
from georep.cli import app as cli_app
from georep.paired.options import backlog_queue_path
from georep.ports import ClaimState, RoleRecord
from georep.testing import FakeMessage, InMemoryRegionSender


def georep(*args: str) -> tuple[int, str, str]:
    completed = run_python("-m", "georep.cli", *args, timeout=60)
    return completed.returncode, completed.stdout, completed.stderr


@pytest.fixture
def app() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def test_an_operator_sees_and_changes_the_roles(app: str) -> None:
    where = ("--redis", REDIS_URL, "--app", app)
    code, out, _ = georep("status", *where)
    assert code == 0 and "no shared roles" in out

    code, out, err = georep(
        "failover", "--to", "secondary", "--entity", "orders", "--force", *where
    )
    assert code == 0, err
    # No process shared the entity yet: --force creates its record, the secondary active.
    assert "orders: secondary active (generation 0)" in out and "georep failover" in out

    code, out, _ = georep("pin", "--region", "secondary", *where)
    assert code == 0 and "pinned" in out
    code, _, err = georep("failback", *where)
    assert code == 2 and "orders is pinned to secondary: run `georep unpin` first" in err

    code, out, _ = georep("status", "--json", "--seen-group", "none-here", *where)
    report = json.loads(out)
    orders = report["entities"]["orders"]
    assert (orders["active"], orders["generation"], orders["pinned"]) == ("secondary", 0, True)
    assert not orders["automatic"] and "georep pin" in orders["changed_by"]
    assert orders["mode"] is None  # made by an operator: the senders' mode is not known
    assert report["seen"] == {
        "group": "none-here",
        "ids": 0,
        "in_flight": 0,
        "expired_claims": 0,
        "receivers": {},
        "complete": True,
    }

    assert georep("unpin", *where)[0] == 0
    code, out, _ = georep("failback", "--json", *where)
    [change] = json.loads(out)
    assert change["changed"] and change["after"]["active"] == "primary"
    assert change["after"]["generation"] == 1 and not change["after"]["pinned"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("failover", "--to", "tertiary"), "unknown region 'tertiary': use one of primary"),
        (("pin", "--region", "west"), "unknown region 'west'"),
        (("failover", "--to", "secondary"), "has shared its roles yet: name the entity"),
    ],
)
def test_bad_input_exits_2_naming_the_fix(app: str, args: tuple[str, ...], message: str) -> None:
    code, _, err = georep(*args, "--redis", REDIS_URL, "--app", app)
    assert code == 2 and message in " ".join(err.split())


def test_an_unreachable_redis_exits_2_naming_the_fix(app: str) -> None:
    code, _, err = georep("status", "--redis", "redis://127.0.0.1:1/0", "--app", app)
    text = " ".join(err.split())
    assert code == 2
    assert "127.0.0.1:1 cannot be reached" in text and "fix: start Redis" in text


def test_redis_and_app_are_required(app: str) -> None:
    code, _, err = georep("status", "--redis", "", "--app", app)
    assert code == 2 and "--redis" in err


def test_status_shows_what_waits_in_the_backlog_queues(app: str) -> None:
    async def create_backlog(emu: Emulator) -> None:
        async with emu.async_admin_client("secondary") as admin:
            await ensure_backlog_queues(
                admin, "east", PairedNamespaceOptions(backlog_queue_count=3)
            )

    with Emulator(queues=()) as emu:
        secondary = emu.connection_string("secondary")
        asyncio.run(create_backlog(emu))
        with (
            ServiceBusClient.from_connection_string(secondary) as client,
            client.get_queue_sender(backlog_queue_path("east", 1)) as sender,
        ):
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        code, out, err = georep(
            "status", "--redis", REDIS_URL, "--app", app, "--json", "--backlog", secondary,
            "--primary-namespace", "east", "--backlog-queues", "3", "--ca-file", str(emu.ca_file),
        )  # fmt: skip
    assert code == 0, err
    backlog = json.loads(out)["backlog"]
    assert backlog["waiting"] == 2 and backlog["unreadable"] == 0
    assert backlog["dead_lettered"] == 0
    assert backlog["queues"][backlog_queue_path("east", 1)] == 2
    assert secondary not in out and "SharedAccessKey" not in out


def cli(*args: str, **env: str | None) -> tuple[int, str]:
    """``georep ARGS`` in this process; its exit status and output (stderr too), unwrapped."""
    environment: dict[str, str | None] = {"REDIS_URL": None, "GEOREP_SECONDARY": None, **env}
    result = CliRunner().invoke(cli_app, list(args), env=environment)
    return result.exit_code, " ".join(result.output.split())


async def record_of(app: str, entity: str) -> RoleRecord | None:
    async with RedisRoleStore.from_url(REDIS_URL, app=app, operation_timeout=LOADED) as store:
        return await store.read(entity)


def test_a_misspelt_entity_is_refused_and_forget_deletes_a_record(app: str) -> None:
    where = ("--redis", REDIS_URL, "--app", app)

    async def a_sender_shared(entity: str) -> None:
        async with RedisRoleStore.from_url(REDIS_URL, app=app, operation_timeout=LOADED) as store:
            await store.create(entity, RoleRecord(active="primary", mode="passive"))

    asyncio.run(a_sender_shared("order-events"))

    code, out = cli("failover", "--to", "secondary", "--entity", "order-event", *where)
    assert code == 2, out
    assert f"no process of application '{app}' has shared roles for 'order-event'" in out
    assert "(entities with a record: order-events)" in out and "--force" in out
    assert asyncio.run(record_of(app, "order-event")) is None, "no record made by a typo"

    code, out = cli("failover", "--to", "secondary", "--entity", "order-event", "--force", *where)
    assert code == 0 and "order-event: secondary active" in out

    code, out = cli("forget", "--entity", "order-event", *where)
    assert code == 0, out
    assert "order-event: role record deleted (was secondary active, generation 0" in out
    assert asyncio.run(record_of(app, "order-event")) is None
    code, out = cli("status", "--json", *where)
    assert list(json.loads(out)["entities"]) == ["order-events"]
    assert cli("forget", "--entity", "order-event", *where) == (
        0,
        "order-event: no role record: nothing deleted",
    )
    code, out = cli("forget", *where)
    assert code == 2 and "name the entities whose records to delete with --entity" in out


async def test_failover_and_pin_refuse_an_active_mode_entity_and_say_why(app: str) -> None:
    where = ("--redis", REDIS_URL, "--app", app)
    async with (
        RedisRoleStore.from_url(REDIS_URL, app=app, operation_timeout=LOADED) as store,
        GeoSender(
            InMemoryRegionSender("primary", "east.example", "orders"),
            InMemoryRegionSender("secondary", "west.example", "orders"),
            mode="active",
            role_store=store,
        ) as sender,
    ):
        for command in (("failover", "--to", "secondary"), ("pin", "--region", "secondary")):
            code, out = await asyncio.to_thread(cli, *command, "--entity", "orders", *where)
            assert code == 2, out
            assert "orders: its senders run in active mode: every message goes to both" in out
            assert "nothing changed" in out
        code, out = await asyncio.to_thread(cli, "failover", "--to", "secondary", *where)
        assert code == 2 and f"every entity of application '{app}' (orders)" in out
        code, out = await asyncio.to_thread(cli, "status", "--json", *where)
        assert code == 0 and json.loads(out)["entities"]["orders"]["mode"] == "active"

        record = await store.read("orders")
        assert record is not None and (record.active, record.generation) == ("primary", 0)
        assert (await sender.send_messages(FakeMessage(b"x"))).accepted == (
            "primary",
            "secondary",
        )


def test_redis_url_is_one_option_name_for_status_and_doctor(app: str) -> None:
    # `georep doctor` said --redis-url, the role commands --redis: both take either.
    code, out = cli("status", "--redis-url", REDIS_URL, "--app", app)
    assert code == 0 and "no shared roles" in out
    code, out = cli("forget", "--entity", "x", "--redis-url", REDIS_URL, "--app", app)
    assert code == 0 and "x: no role record" in out


async def test_status_counts_the_ids_of_a_seen_set_group_not_its_keys(app: str) -> None:
    group = f"cli-{uuid.uuid4().hex[:8]}"
    ids = [f"order-{n}" for n in range(150)]
    # An hour's lease and window: claims and ids still count however long status takes.
    async with RedisSeenSet.from_url(REDIS_URL, group=group, window=3600) as seen:
        await seen.claim(ids, owner="r1", lease=3600)
        await seen.commit(ids[:100], owner="r1")
        # Ten recorded again a window later: each is then in two buckets of its hash.
        now = seen._wall_clock_ms()
        seen._wall_clock_ms = lambda: now + 3_600_000
        await seen.commit(ids[:10], owner="r1", outcome=ClaimState.DEFERRED)

    # The scan reads the whole keyspace, which the rest of the suite fills: give it room.
    where = ("--seen-group", group, "--redis", REDIS_URL, "--app", app, "--timeout", "120")
    code, out = await asyncio.to_thread(cli, "status", "--json", *where)
    assert code == 0, out
    seen_report = json.loads(out)["seen"]
    assert seen_report["receivers"] == {"r1": {"claims": 50, "expired": 0}}
    assert (seen_report["ids"], seen_report["in_flight"], seen_report["complete"]) == (
        100,
        50,
        True,
    )
    code, out = await asyncio.to_thread(cli, "status", *where)
    assert f"seen-set {group}: 100 ids held, 50 in flight (claimed) by 1 receiver" in out


def test_status_uses_georep_secondary_only_for_backlog_depths_and_says_so(app: str) -> None:
    where = ("--redis", REDIS_URL, "--app", app)
    secondary = "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=s3cr3t"
    # Set for `georep doctor` or the syphon: status without backlog options ignores it.
    code, out = cli("status", *where, GEOREP_SECONDARY=secondary)
    assert code == 0 and "no shared roles" in out and "backlog" not in out

    code, out = cli("status", *where, "--primary-namespace", "east", GEOREP_SECONDARY="oops")
    assert code == 2
    assert "backlog: the secondary's connection string comes from $GEOREP_SECONDARY" in out
    assert "the connection string in $GEOREP_SECONDARY is malformed" in out
    code, out = cli("status", *where, "--primary-namespace", "east")
    assert code == 2 and "pass --backlog or --secondary, or set $GEOREP_SECONDARY" in out
    code, out = cli("status", *where, "--backlog", secondary)
    assert code == 2 and "--backlog needs --primary-namespace" in out
    assert "s3cr3t" not in out
