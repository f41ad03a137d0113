"""`georep status` beyond the roles: each region's messages, dead letters, scheduled messages
and lag per entity (the real SDK's management client and a peek, against the emulator),
Redis and the regions reported when they do not answer, the receivers holding claims in
the seen-set, the outbox file."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _helpers import LOADED, PACE, REDIS_URL
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from typer.testing import CliRunner

from georep import PairedNamespaceOptions, SqliteOutbox
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisRoleStore, RedisSeenSet
from georep.adapters.servicebus import ensure_backlog_queues
from georep.cli import app as cli_app
from georep.ports import RoleRecord

pytestmark = pytest.mark.integration

_ENVIRONMENT = ("REDIS_URL", "GEOREP_APP", "GEOREP_PRIMARY", "GEOREP_SECONDARY", "GEOREP_CA_FILE")


def status(*args: str, **env: str) -> tuple[int, str, str]:
    """``georep status ARGS`` in this process, with only the environment given: exit
    status, stdout, and stdout with stderr (unwrapped)."""
    environment: dict[str, str | None] = {name: None for name in _ENVIRONMENT}
    environment.update(env)
    result = CliRunner().invoke(cli_app, ["status", *args], env=environment)
    return result.exit_code, result.stdout, " ".join(result.output.split())


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    """One pair for the module: ``orders`` holds 3 messages in the primary (one
    dead-lettered, one scheduled for later), the topic ``events`` one in the secondary's
    subscription ``billing``, and the secondary one paired backlog queue."""
    with Emulator(queues=("orders",), topics={"events": ["billing"]}) as emulator:
        asyncio.run(_fill(emulator))
        yield emulator


async def _fill(emu: Emulator) -> None:
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    async with ServiceBusClient.from_connection_string(primary) as client:
        async with client.get_queue_sender("orders") as sender:
            await sender.send_messages([ServiceBusMessage(f"order {n}") for n in range(3)])
            later = datetime.now(UTC) + timedelta(hours=1)
            await sender.schedule_messages(ServiceBusMessage("later"), later)
        async with client.get_queue_receiver("orders") as receiver:
            [first] = await receiver.receive_messages(max_message_count=1, max_wait_time=10)
            await receiver.dead_letter_message(first, reason="test")
    async with (
        ServiceBusClient.from_connection_string(secondary) as client,
        client.get_topic_sender("events") as sender,
    ):
        await sender.send_messages(ServiceBusMessage("event"))
    async with emu.async_admin_client("secondary") as admin:
        await ensure_backlog_queues(admin, "east", PairedNamespaceOptions(backlog_queue_count=1))


@pytest.fixture
def app() -> str:
    return f"status-{uuid.uuid4().hex[:8]}"


def namespaces(emu: Emulator) -> tuple[str, ...]:
    return (
        "--primary", emu.connection_string("primary"),
        "--secondary", emu.connection_string("secondary"),
        "--ca-file", str(emu.ca_file),
    )  # fmt: skip


def test_status_counts_each_regions_messages_and_lag_for_the_entities_with_a_role(
    emu: Emulator, app: str
) -> None:
    async def a_sender_shared(entity: str) -> None:
        async with RedisRoleStore.from_url(REDIS_URL, app=app, operation_timeout=LOADED) as store:
            await store.create(entity, RoleRecord(active="primary", mode="passive"))

    asyncio.run(a_sender_shared("orders"))
    where = ("--redis", REDIS_URL, "--app", app, *namespaces(emu))
    before = datetime.now(UTC)

    code, stdout, output = status("--json", *where)
    assert code == 0, output
    report = json.loads(stdout)
    assert report["redis"]["reachable"] and report["entities"]["orders"]["active"] == "primary"
    primary = report["regions"]["primary"]
    assert primary["reachable"] and list(primary["entities"]) == ["orders"]
    orders = primary["entities"]["orders"]
    assert (orders["active"], orders["dead_letter"], orders["scheduled"]) == (2, 1, 1)
    # The oldest active message was peeked: the second one sent (the first is dead).
    oldest = datetime.fromisoformat(orders["oldest_enqueued"])
    assert oldest <= before and orders["lag_seconds"] >= 0
    secondary = report["regions"]["secondary"]["entities"]["orders"]
    assert (secondary["active"], secondary["lag_seconds"]) == (0, None)
    for connection_string in (emu.connection_string("primary"), "SharedAccessKey="):
        assert connection_string not in output


def test_status_names_entities_and_splits_a_topic_by_subscription(emu: Emulator) -> None:
    code, stdout, output = status("--json", "--entity", "events", "--entity", "nope",
                                  *namespaces(emu))  # fmt: skip
    assert code == 0, output
    regions = json.loads(stdout)["regions"]
    billing = regions["secondary"]["entities"]["events/Subscriptions/billing"]
    assert (billing["active"], billing["dead_letter"], billing["scheduled"]) == (1, 0, None)
    assert billing["lag_seconds"] is not None
    assert regions["primary"]["entities"]["events/Subscriptions/billing"]["active"] == 0
    assert regions["primary"]["entities"]["nope"]["found"] is False
    assert (
        "nope primary - - - no such queue or topic here"
        in status("--entity", "nope", *namespaces(emu))[2]
    )


def test_without_redis_status_lists_every_queue_and_topic_from_the_environment(
    emu: Emulator,
) -> None:
    code, stdout, output = status(
        "--json",
        GEOREP_PRIMARY=emu.connection_string("primary"),
        GEOREP_SECONDARY=emu.connection_string("secondary"),
        GEOREP_CA_FILE=str(emu.ca_file),
    )
    assert code == 0, output
    assert "regions: connection strings from $GEOREP_PRIMARY and $GEOREP_SECONDARY" in output
    report = json.loads(stdout)
    assert "redis" not in report and "entities" not in report
    # The backlog queue (east/x-servicebus-transfer/0) is the syphon's, not an entity.
    assert sorted(report["regions"]["secondary"]["entities"]) == [
        "events/Subscriptions/billing",
        "orders",
    ]


def test_a_region_or_redis_that_does_not_answer_is_named_and_the_rest_still_shown(
    emu: Emulator, app: str
) -> None:
    emu.namespace("primary").outage()
    try:
        code, stdout, output = status(
            "--json", "--redis", "redis://127.0.0.1:1/0", "--app", app, *namespaces(emu)
        )
    finally:
        emu.namespace("primary").restore()
    assert code == 1, output
    report = json.loads(stdout)
    assert not report["redis"]["reachable"]
    assert "redis at 127.0.0.1:1 cannot be reached" in report["redis"]["error"]
    primary, secondary = report["regions"]["primary"], report["regions"]["secondary"]
    assert not primary["reachable"] and primary["error"].startswith("cannot be reached")
    assert primary["entities"] == {}
    assert secondary["reachable"] and secondary["entities"]["orders"]["active"] == 0

    emu.namespace("primary").outage()
    try:
        code, _, output = status("--entity", "orders", *namespaces(emu))
    finally:
        emu.namespace("primary").restore()
    assert code == 1 and "orders secondary 0 0 0 -" in output, output
    port = emu.namespace("primary").port
    assert f"primary 127.0.0.1:{port}: UNREACHABLE: cannot be reached (" in output
    assert "orders primary" not in output

    # Redis alone asked for, and not answering: nothing to show.
    code, _, output = status("--redis", "redis://127.0.0.1:1/0", "--app", app)
    assert code == 2 and "fix: start Redis" in output


def test_a_region_is_asked_before_it_is_said_to_answer_even_with_no_entity_to_count(
    emu: Emulator, app: str
) -> None:
    # No role record, no --entity, and neither namespace could be listed (the primary is
    # down; the secondary's certificate is not trusted without --ca-file): no entity to
    # count, and both regions were reported "answers" (exit 0) without being asked.
    port = emu.namespace("primary").port
    emu.namespace("primary").outage()
    try:
        code, _, output = status(
            "--redis", REDIS_URL, "--app", app,
            "--primary", emu.connection_string("primary"),
            "--secondary", emu.connection_string("secondary"),
        )  # fmt: skip
    finally:
        emu.namespace("primary").restore()
    assert code == 1, output
    assert f"primary 127.0.0.1:{port}: UNREACHABLE: cannot be reached (" in output, output
    assert "UNREACHABLE: certificate verification error" in output, output


def test_a_region_that_accepts_but_never_answers_is_reported_as_timing_out(emu: Emulator) -> None:
    # The bound is the blackholed primary's whole wait, and the answering secondary's too:
    # 0.5 s ran out for the secondary on a machine three times slower (PACE 3).
    bound = str(1.0 * PACE)
    emu.namespace("primary").blackhole()
    try:
        code, stdout, output = status(
            "--json", "--entity", "orders", "--entity", "events", "--timeout", bound,
            *namespaces(emu),
        )  # fmt: skip
    finally:
        emu.namespace("primary").restore()
    assert code == 1, output
    regions = json.loads(stdout)["regions"]
    assert regions["primary"]["error"] == "did not answer in time (TimeoutError)"
    assert regions["secondary"]["reachable"]


def test_the_admin_certificate_refused_is_named_not_blamed_on_the_network(
    emu: Emulator,
) -> None:
    code, stdout, output = status(
        "--json",
        "--entity", "orders",
        "--primary", emu.connection_string("primary"),
        "--secondary", emu.connection_string("secondary"),
    )  # fmt: skip
    assert code == 1, output
    error = json.loads(stdout)["regions"]["primary"]["error"]
    assert "certificate verification error" in error and "--ca-file" in error


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {}, "nothing to show: pass --redis"),
        (("--primary", "Endpoint=sb://a/;SharedAccessKeyName=k;SharedAccessKey=s3cr3t"), {},
         "the messages per region need both namespaces: pass --secondary"),
        (("--primary", "Endpoint=sb://a/;SharedAccessKeyName=k;SharedAccessKey=s3cr3t",
          "--secondary", "oops"), {}, "the secondary connection string"),
        (("--outbox", "/nonexistent/outbox.db"), {}, "no outbox file at /nonexistent/outbox.db"),
        (("--redis", REDIS_URL), {}, "no application named: pass --app"),
        # Not blamed on --redis (it was: "--redis: Invalid IPv6 URL", "--redis: cannot use
        # ... as an outbox"), and an Endpoint without a host named (it was a traceback).
        (("--redis", REDIS_URL, "--app", "x", "--primary",
          "Endpoint=https://[::1;SharedAccessKeyName=k;SharedAccessKey=s3cr3t",
          "--secondary", "Endpoint=sb://b/;SharedAccessKeyName=k;SharedAccessKey=s3cr3t"), {},
         "--primary/--secondary (a connection string's Endpoint): Invalid IPv6 URL"),
        (("--primary", "Endpoint=sb://;SharedAccessKeyName=k;SharedAccessKey=s3cr3t",
          "--secondary", "Endpoint=sb://b/;SharedAccessKeyName=k;SharedAccessKey=s3cr3t"), {},
         "the primary connection string's Endpoint names no host"),
        (("--outbox", __file__), {}, "is not a georep outbox"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_naming_the_fix_and_no_secret(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    code, _, output = status(*args, **env)
    assert code == 2 and message in output, output
    assert "s3cr3t" not in output


def test_one_namespace_variable_alone_is_not_a_pair_and_says_so(app: str) -> None:
    code, _, output = status(
        "--redis", REDIS_URL, "--app", app,
        GEOREP_SECONDARY="Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=s",
    )  # fmt: skip
    assert code == 0 and "only $GEOREP_SECONDARY is set" in output
    assert "dead-lettered" not in output and "UNREACHABLE" not in output


async def test_status_names_the_receivers_holding_claims_and_the_expired_ones(app: str) -> None:
    group = f"status-{uuid.uuid4().hex[:8]}"
    # An hour's lease and window: web-1's claim and the id "b" must still count when status
    # reads them, however long a loaded machine takes to get there (a 30 s lease ran out
    # once in CI; a 60 s window, with "b" gone, once too).
    async with RedisSeenSet.from_url(REDIS_URL, group=group, window=3600) as seen:
        await seen.claim(["a", "b"], owner="web-1:42:aaaa/primary", lease=3600)
        await seen.claim(["c"], owner="web-2:7:bbbb/secondary", lease=3600)
        await seen.commit(["b"], owner="web-1:42:aaaa/primary")
        # web-2 crashed: its claim's deadline passed (set in the past rather than waited).
        claims = [key async for key in seen._redis.scan_iter(match=f"georep:seen:{group}:*:c")]
        for key in claims:
            for field, value in (await seen._redis.hgetall(key)).items():
                if value.endswith(b"|web-2:7:bbbb/secondary"):
                    await seen._redis.hset(key, field, b"1|web-2:7:bbbb/secondary")

    code, stdout, output = await asyncio.to_thread(
        status, "--json", "--seen-group", group, "--redis", REDIS_URL, "--app", app
    )
    assert code == 0, output
    assert json.loads(stdout)["seen"] == {
        "group": group,
        "ids": 1,
        "in_flight": 1,
        "expired_claims": 1,
        "receivers": {
            "web-1:42:aaaa/primary": {"claims": 1, "expired": 0},
            "web-2:7:bbbb/secondary": {"claims": 0, "expired": 1},
        },
        "complete": True,
    }
    _, _, output = await asyncio.to_thread(
        status, "--seen-group", group, "--redis", REDIS_URL, "--app", app
    )
    assert f"seen-set {group}: 1 ids held, 1 in flight (claimed) by 1 receiver, 1 claims" in output
    assert "receiver web-2:7:bbbb/secondary: 0 in flight, 1 expired (this receiver stopped" in (
        output
    )


async def test_status_shows_what_waits_in_an_outbox_and_since_when(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    async with SqliteOutbox(path) as outbox:
        [_, _, dead] = await outbox.put(
            "east|west|orders", [(None, b"a"), (None, b"b"), (None, b"c")], now=time.time() - 60
        )
        await outbox.dead_letter([(dead, "EntityNotFoundError (entity-not-found)")], now=0)

    code, stdout, output = await asyncio.to_thread(status, "--json", "--outbox", str(path))
    assert code == 0, output
    report = json.loads(stdout)["outbox"]
    assert (report["queued"], report["dead"]) == (2, 1)
    assert report["oldest_queued_age_seconds"] >= 60
    _, _, output = await asyncio.to_thread(status, "--outbox", str(path))
    assert f"outbox {path}: 2 messages waiting, the oldest queued" in output
    assert "1 dead-lettered" in output
