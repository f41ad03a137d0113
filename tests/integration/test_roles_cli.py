"""`georep status`, `failover`, `failback`, `pin` and `unpin` against a real Redis."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from _helpers import REDIS_URL, run_python
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from georep import PairedNamespaceOptions
from georep._paired import backlog_queue_path
from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import ensure_backlog_queues


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

    code, out, err = georep("failover", "--to", "secondary", "--entity", "orders", *where)
    assert code == 0, err
    # No process shared the entity yet: the command creates its record, the secondary active.
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
    assert report["seen_keys"] == {"group": "none-here", "count": 0, "complete": True}

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
    assert backlog["queues"][backlog_queue_path("east", 1)] == 2
    assert secondary not in out and "SharedAccessKey" not in out
