"""Authentication, bad input and injected faults, each mapped to the SDK's own exception."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from _helpers import sdk_sender
from azure.core.credentials import AzureSasCredential
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)

from georep.adapters.emulator import Emulator
from georep.adapters.relay import mint_sas_token
from georep.exceptions import EmulatorError

pytestmark = pytest.mark.integration

EmulatorFactory = Callable[..., Emulator]


def _key(connection_string: str) -> tuple[str, str]:
    parts = dict(p.split("=", 1) for p in connection_string.split(";") if p)
    return parts["SharedAccessKeyName"], parts["SharedAccessKey"]


async def _send(connection_string: str, queue: str, **send_kwargs: object) -> None:
    async with sdk_sender(connection_string, queue, retry_total=0) as sender:
        await sender.send_messages(ServiceBusMessage("m"), **send_kwargs)  # type: ignore[arg-type]


@pytest.fixture
def emu(georep_emulator_factory: EmulatorFactory) -> Emulator:
    """An emulator of the test's own (the test injects faults) with one queue, ``q``."""
    return georep_emulator_factory(queues=("q",))


@contextlib.asynccontextmanager
async def _connected_then(emu: Emulator, fault: str) -> AsyncIterator[Any]:
    """A sender on the primary's ``q`` whose connection is open (it has sent ``before``),
    then ``fault`` (a method of the namespace control) injected."""
    async with sdk_sender(emu.connection_string("primary"), "q", retry_total=0) as sender:
        await sender.send_messages(ServiceBusMessage("before"))
        getattr(emu.namespace("primary"), fault)()
        yield sender


# -- authentication and bad input --------------------------------------------------------


async def test_wrong_key_raises_authentication_error(georep_emulator: Emulator) -> None:
    good = georep_emulator.connection_string("primary")
    _, key = _key(good)
    wrong = good.replace(key, base64.b64encode(b"not the key").decode())
    with pytest.raises(ServiceBusAuthenticationError):
        await _send(wrong, "orders")


async def test_each_namespace_has_its_own_key(georep_emulator: Emulator) -> None:
    _, secondary_key = _key(georep_emulator.connection_string("secondary"))
    primary = georep_emulator.connection_string("primary")
    with pytest.raises(ServiceBusAuthenticationError):
        await _send(primary.replace(_key(primary)[1], secondary_key), "orders")


async def test_expired_token_is_refused_and_fresh_one_accepted(georep_emulator: Emulator) -> None:
    control = georep_emulator.namespace("primary")
    key_name, key = _key(control.connection_string)
    host = f"127.0.0.1:{control.port}"
    audience = f"sb://{host}/orders"
    expired = AzureSasCredential(mint_sas_token(audience, key_name, key, time.time() - 60))
    async with ServiceBusClient(host, expired, retry_total=0, use_tls=False) as client:
        with pytest.raises(ServiceBusAuthenticationError):
            async with client.get_queue_sender("orders") as sender:
                await sender.send_messages(ServiceBusMessage("m"))
    fresh = AzureSasCredential(mint_sas_token(audience, key_name, key, time.time() + 3600))
    async with (
        ServiceBusClient(host, fresh, retry_total=0, use_tls=False) as client,
        client.get_queue_sender("orders") as sender,
    ):
        await sender.send_messages(ServiceBusMessage("m"))


async def test_oversize_message_raises_size_error_and_stores_nothing(
    georep_emulator: Emulator, queue: str
) -> None:
    async with (
        ServiceBusClient.from_connection_string(
            georep_emulator.connection_string("primary"), retry_total=0
        ) as client,
        client.get_queue_sender(queue) as sender,
    ):
        with pytest.raises(MessageSizeExceededError, match="262144"):
            await sender.send_messages(ServiceBusMessage(b"x" * 300_000))
    assert georep_emulator.namespace("primary").message_count(queue) == 0


async def test_unknown_entity_raises_not_found(georep_emulator: Emulator) -> None:
    with pytest.raises(MessagingEntityNotFoundError, match="no-such-queue"):
        await _send(georep_emulator.connection_string("primary"), "no-such-queue")


# -- faults ----------------------------------------------------------------------------------


async def test_outage_refuses_connections_keeps_data_and_restore_recovers(emu: Emulator) -> None:
    control = emu.namespace("primary")
    async with _connected_then(emu, "outage") as sender:
        with pytest.raises(ServiceBusConnectionError):
            await sender.send_messages(ServiceBusMessage("lost?"))
    conn = emu.connection_string("primary")
    with pytest.raises(ServiceBusConnectionError):
        await _send(conn, "q")
    await _send(emu.connection_string("secondary"), "q")  # the other region is unaffected
    control.restore()
    assert control.message_count("q") == 1
    await _send(conn, "q")
    assert control.message_count("q") == 2


def test_a_namespace_holds_its_port_while_down_so_restore_can_listen_on_it(emu: Emulator) -> None:
    # Another process binding a free port (every test's emulator does) must not get the port
    # of a namespace in outage, or restore() could not listen on it again.
    # The same for the relay's port (a full suite run once lost it to a worker's
    # ephemeral client port while the namespace was down).
    control = emu.namespace("primary")
    ports = {"amqp": control.port, "relay": control.relay_port}
    assert all(ports.values()), ports
    control.outage()
    for name, port in ports.items():
        with socket.socket() as intruder:
            with pytest.raises(OSError) as taken:
                intruder.bind(("127.0.0.1", port))
            assert taken.value.errno == errno.EADDRINUSE, name
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
    control.restore()
    for port in ports.values():
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    control.outage()  # and again: the reservation is let go once listening, and taken anew
    control.restore()
    for port in ports.values():
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


async def test_blackhole_times_out_existing_and_new_connections(emu: Emulator) -> None:
    async with _connected_then(emu, "blackhole") as sender:
        with pytest.raises(OperationTimeoutError):
            await sender.send_messages(ServiceBusMessage("unanswered"), timeout=1)
    conn = emu.connection_string("primary")
    # A new connection: the SDK's own open has no deadline (``async with sender`` would hang
    # here), so the send's timeout must bound the open as well.
    async with ServiceBusClient.from_connection_string(conn, retry_total=0) as client:
        sender = client.get_queue_sender("q")
        with pytest.raises(OperationTimeoutError):
            await asyncio.wait_for(
                sender.send_messages(ServiceBusMessage("m"), timeout=1), timeout=30
            )
        await sender.close()
    emu.namespace("primary").restore()
    await _send(conn, "q")


async def test_latency_delays_every_response(emu: Emulator) -> None:
    async with sdk_sender(emu.connection_string("primary"), "q") as sender:
        await sender.send_messages(ServiceBusMessage("warm"))
        started = time.perf_counter()
        await sender.send_messages(ServiceBusMessage("fast"))
        fast = time.perf_counter() - started
        emu.namespace("primary").latency(0.3)
        started = time.perf_counter()
        await sender.send_messages(ServiceBusMessage("slow"))
        slow = time.perf_counter() - started
    assert slow >= 0.3 > fast


@pytest.mark.parametrize(
    ("condition", "error"),
    [
        ("server-busy", ServiceBusServerBusyError),
        ("timeout", OperationTimeoutError),
        ("quota-exceeded", ServiceBusQuotaExceededError),
        ("internal-error", ServiceBusError),
    ],
)
async def test_reject_sends_maps_to_sdk_errors(
    emu: Emulator, condition: str, error: type[Exception]
) -> None:
    control = emu.namespace("primary")
    control.reject_sends(condition)  # type: ignore[arg-type]
    with pytest.raises(error):
        await _send(emu.connection_string("primary"), "q")
    assert control.message_count("q") == 0
    control.reject_sends(None)
    await _send(emu.connection_string("primary"), "q")
    assert control.message_count("q") == 1


async def test_drop_dispositions_stores_but_never_answers(emu: Emulator) -> None:
    control = emu.namespace("primary")
    control.drop_dispositions(1)
    with pytest.raises(OperationTimeoutError):
        await _send(emu.connection_string("primary"), "q", timeout=1)
    assert control.message_count("q") == 1  # stored although the sender saw a failure
    await _send(emu.connection_string("primary"), "q")  # only one was dropped
    assert control.message_count("q") == 2


async def test_a_lost_settlement_leaves_the_message_to_come_again_when_its_lock_runs_out(
    emu: Emulator,
) -> None:
    control = emu.namespace("primary")
    control.create_queue("short", lock_duration=1)
    async with sdk_sender(emu.connection_string("primary"), "short") as sender:
        await sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    # The receiver's timeout: how long the SDK waits for a settlement's outcome (60 s by
    # default) before it settles through the management link instead.
    async with (
        ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client,
        client.get_queue_receiver("short", timeout=3) as receiver,
    ):
        first = await receiver.receive_messages(max_message_count=2, max_wait_time=5)
        assert [str(m) for m in first] == ["a", "b"]
        await receiver.complete_message(first[1])
        control.lose_settlements(1)
        with pytest.raises(MessageLockLostError):  # never answered; by then the lock ran out
            await receiver.complete_message(first[0])
        again = await receiver.receive_messages(max_message_count=2, max_wait_time=10)
        assert [(str(m), m.delivery_count) for m in again] == [("a", 1)]
        await receiver.complete_message(again[0])
    assert control.message_count("short") == 0


async def test_disaster_loses_the_data_of_that_namespace_only(emu: Emulator) -> None:
    for namespace in emu.namespaces:
        await _send(emu.connection_string(namespace), "q")
    emu.namespace("primary").disaster()
    with pytest.raises(ServiceBusConnectionError):
        await _send(emu.connection_string("primary"), "q")
    emu.namespace("primary").restore()
    assert emu.namespace("primary").message_count("q") == 0
    assert emu.namespace("secondary").message_count("q") == 1


# -- control interfaces ------------------------------------------------------------------------


def test_http_control_endpoint_injects_faults(emu: Emulator) -> None:

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        request = urllib.request.Request(
            emu.control_url + path, data=json.dumps(body).encode(), method="POST",
            headers=emu.control_headers(),
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    state = post("/namespaces/primary/faults/latency", {"seconds": 0.25})
    assert state["latency"] == 0.25
    assert emu.namespace("primary").faults()["latency"] == 0.25
    with pytest.raises(urllib.error.HTTPError) as info:
        post("/namespaces/primary/faults/meteor", {})
    assert info.value.code == 404
    with pytest.raises(EmulatorError, match="unknown namespace"):
        emu._call("GET", "/namespaces/nowhere/faults")


def test_cli_runs_the_emulator_in_the_foreground_and_stops_on_signal() -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "georep.cli",
            "emulator",
            "--port",
            "0",
            "--port",
            "0",
            "--control-port",
            "0",
            "--hybrid-connection",
            "svc",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [process.stdout.readline() for _ in range(4)]  # type: ignore[union-attr]
        assert "georep emulator ready" in lines[0]
        assert lines[1].strip().startswith("primary: Endpoint=sb://127.0.0.1:")
        assert "UseDevelopmentEmulator=true" in lines[1]
        assert "relay: wss://127.0.0.1:" in lines[2] and "svc" in lines[2]
        assert lines[3].strip().startswith("secondary: Endpoint=sb://127.0.0.1:")
        # The printed token is what `georep fault` needs; without it the endpoint refuses.
        found = re.search(r"control: (http://\S+), control token: (\S+),", lines[0])
        assert found, lines[0]
        url, token = found.groups()

        def fault(**env: str) -> subprocess.CompletedProcess[str]:
            environment = {k: v for k, v in os.environ.items() if "GEOREP_EMULATOR" not in k}
            return subprocess.run(
                [sys.executable, "-m", "georep.cli", "fault", "primary", "latency",
                 "--seconds", "0.1", "--control-url", url],
                capture_output=True, text=True, timeout=60, env={**environment, **env},
            )  # fmt: skip

        refused = fault()
        assert refused.returncode == 2 and "control token" in refused.stdout
        accepted = fault(GEOREP_EMULATOR_CONTROL_TOKEN=token)
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        assert "'latency': 0.1" in accepted.stdout
    finally:
        process.send_signal(2)  # Ctrl-C
        assert process.wait(timeout=15) == 0


def fault_cli(emu: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``georep fault ARGS`` against ``emu``, in a child process."""
    control = ["--control-url", emu.control_url, "--control-token", emu.control_token]
    return subprocess.run(
        [sys.executable, "-m", "georep.cli", "fault", *args, *control],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_injects_faults_into_a_running_emulator(emu: Emulator) -> None:

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return fault_cli(emu, *args)

    assert cli("primary", "reject-sends", "--condition", "server-busy").returncode == 0
    assert emu.namespace("primary").faults()["reject_sends"] == "server-busy"
    assert cli("primary", "latency", "--seconds", "0.5").returncode == 0
    assert emu.namespace("primary").faults()["latency"] == 0.5
    assert cli("primary", "outage").returncode == 0
    assert emu.namespace("primary").faults()["down"] is True
    assert cli("primary", "restore").returncode == 0
    cleared = {"down": False, "blackhole": False, "latency": 0.0, "reject_sends": None}
    assert emu.namespace("primary").faults() == {
        **cleared,
        "dropped_dispositions": 0,
        "lost_settlements": 0,
    }
    bad = cli("primary", "meteor")
    assert bad.returncode == 2 and "unknown fault" in bad.stdout


def test_cli_takes_a_partitioned_entity_fragment_down_and_up(
    georep_emulator_factory: EmulatorFactory,
) -> None:
    emu = georep_emulator_factory(queues=("q",))
    emu.namespace("primary").create_queue("p", enable_partitioning=True)
    down = fault_cli(emu, "primary", "fragment-down", "--entity", "p", "--index", "3")
    assert down.returncode == 0, down.stdout + down.stderr
    assert emu.namespace("primary").fragments_down() == {"p": [3]}
    assert fault_cli(emu, "primary", "fragment-up", "--entity", "p", "--index", "3").returncode == 0
    assert emu.namespace("primary").fragments_down() == {}


FREE_PORTS = ("--port", "0", "--port", "0", "--control-port", "0")


@contextlib.contextmanager
def foreground_emulator(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``georep emulator ARGS`` on free ports, stopped with Ctrl-C (by its PID) after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "georep.cli", "emulator", *FREE_PORTS, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.send_signal(2)
        assert process.wait(timeout=15) == 0


def _control_get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_cli_emulator_with_a_topic_only_creates_no_default_queue_and_prints_json() -> None:
    # Before: the queue `orders` was always added, and a topic `orders` died in a traceback.
    with foreground_emulator("--topic", "orders:billing,shipping", "--print", "json") as process:
        description = json.loads(process.stdout.readline())  # type: ignore[union-attr]
        entities = _control_get(
            f"{description['control_url']}/namespaces/primary/entities",
            description["control_token"],
        )
    assert sorted(entities) == ["orders/Subscriptions/billing", "orders/Subscriptions/shipping"]


def test_cli_emulator_prints_export_lines_a_script_can_use() -> None:
    with foreground_emulator("--queue", "q", "--print", "env") as process:
        lines = []
        while not lines or "GEOREP_EMULATOR_CONTROL_TOKEN" not in lines[-1]:
            lines.append(process.stdout.readline())  # type: ignore[union-attr]
        exported = dict(
            shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines
        )
        assert sorted(exported) == [
            "GEOREP_CA_FILE",
            "GEOREP_EMULATOR_CONTROL_TOKEN",
            "GEOREP_EMULATOR_CONTROL_URL",
            "GEOREP_PRIMARY",
            "GEOREP_SECONDARY",
        ]
        assert all(line.startswith("export GEOREP_") for line in lines)
        # The variables are the ones georep's own commands read.
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GEOREP_")}
        fault = subprocess.run(
            [sys.executable, "-m", "georep.cli", "fault", "primary", "latency", "--seconds", "0"],
            capture_output=True, text=True, timeout=60, env={**environment, **exported},
        )  # fmt: skip
        assert fault.returncode == 0, fault.stdout + fault.stderr
        doctor = subprocess.run(
            [sys.executable, "-m", "georep.cli", "doctor", "--entity", "q", "--timeout", "5"],
            capture_output=True, text=True, timeout=60, env={**environment, **exported},
        )  # fmt: skip
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--queue", "orders", "--topic", "orders:billing"),
         "error: the topic 'orders' clashes with the queue 'orders': queues and topics share "
         "one set of names in a namespace; rename one"),
        (("--session-queue", "s", "--queue", "s"),
         "error: the session queue 's' clashes with the queue 's'"),
        (("--queue", "a", "--queue", "a"), "error: the queue 'a' is given twice: give it once"),
        (("--topic", "t:x,x"), "error: topic 't' names the subscription 'x' twice: give it once"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", [("georep.cli", "emulator"), ("georep.adapters.emulator",)])
def test_clashing_entity_names_are_one_line_errors(
    command: tuple[str, ...], args: tuple[str, ...], error: str
) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", *command, *FREE_PORTS, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 2
    [line] = completed.stderr.strip().splitlines()
    assert line.startswith(error)
    assert completed.stdout == ""


def test_cli_emulator_takes_its_control_token() -> None:
    with foreground_emulator("--control-token", "chosen-token", "--print", "json") as process:
        description = json.loads(process.stdout.readline())  # type: ignore[union-attr]
        assert description["control_token"] == "chosen-token"
        assert _control_get(description["control_url"], "chosen-token")["namespaces"]


def test_cli_toggles_the_relay_no_listener_fault(georep_emulator_factory: EmulatorFactory) -> None:
    emu = georep_emulator_factory(queues=("q",), hybrid_connections=("svc",))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return fault_cli(emu, *args)

    assert cli("primary", "relay-no-listener", "--path", "svc").returncode == 0
    assert emu.namespace("primary").relay()["no_listener"] == ["svc"]
    assert cli("primary", "relay-no-listener", "--path", "svc", "--off").returncode == 0
    assert emu.namespace("primary").relay()["no_listener"] == []
    missing = cli("primary", "relay-no-listener")
    assert missing.returncode == 2 and "needs" in missing.stdout
