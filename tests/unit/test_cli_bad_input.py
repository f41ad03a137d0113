"""Bad input to the CLI, as an operator types it: one line naming the problem and the fix,
exit status 2, no traceback and no secret (found by operating each command)."""

from __future__ import annotations

import socket
import sys

import pytest
from typer.testing import CliRunner

from georep.adapters.emulator._sockets import bind_loopback
from georep.cli import app
from georep.cli._app import main

KEY = "c2VjcmV0a2V5MTIz"
CONNECTION = f"Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=x;SharedAccessKey={KEY}"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("emulator", "--port", "-1"), "port -1 is not one: use 1-65535, or 0"),
        (("emulator", "--control-port", "70000"), "port 70000 is not one"),
        (("emulator", "--namespace", "a", "--namespace", "a"), "--namespace a given twice"),
        (("fault", "primary", "latency", "--seconds", "inf"), "--seconds inf: give a finite"),
        (("fault", "primary", "latency", "--seconds", "nan"), "--seconds nan: give a finite"),
        (("fault", "primary", "outage", "--control-url", "notaurl"), "is not an http:// URL"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(args: tuple[str, ...], says: str) -> None:
    code, output = run(*args)
    assert code == 2 and says in output, output
    assert "Traceback" not in output


def test_a_url_password_given_in_an_option_is_never_printed() -> None:
    code, output = run(
        "fault", "primary", "outage", "--control-url", "http://ops:Sup3rS3cret@127.0.0.1:1"
    )
    assert code == 1 and "no emulator answers at http://ops:***@127.0.0.1:1" in output
    assert "Sup3rS3cret" not in output


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["syphon", "--primary-namespace", ""], "cannot make a namespace name of ''"),
        (
            ["syphon", "--primary-namespace", "pn", "--primary", "garbage"],
            "the primary connection string has no 'Name=value' parts",
        ),
    ],
)
def test_bad_input_the_library_refuses_is_one_line_and_exit_2(
    argv: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused by the library (ConfigurationError), not by the command's own checks: it
    was a traceback and exit 1 (and a malformed --primary let the syphon run on)."""
    monkeypatch.setenv("GEOREP_PRIMARY", CONNECTION)
    monkeypatch.setenv("GEOREP_SECONDARY", CONNECTION)
    monkeypatch.setattr(sys, "argv", ["georep", *argv])
    with pytest.raises(SystemExit) as raised:
        main()
    output = " ".join(capsys.readouterr().err.split())
    assert raised.value.code == 2 and says in output, output
    assert "Traceback" not in output and KEY not in output


def test_an_emulator_port_another_process_listens_on_is_refused() -> None:
    """Both with SO_REUSEPORT, a second emulator bound the first one's port and the kernel
    split the connections between them; its own outages still bind its ports again."""
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen()
    try:
        with pytest.raises(OSError, match="is in use by another process"):
            bind_loopback(other.getsockname()[1])
    finally:
        other.close()
    ours = bind_loopback(0)
    again = bind_loopback(ours.getsockname()[1])  # an outage's reservation of our own port
    ours.close()
    again.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--primary", "garbage", "--secondary", "garbage"), "primary connection string has no"),
        (("--work-dir", __file__), "is a file: give a directory"),
    ],
)
def test_the_demo_refuses_what_it_cannot_use_before_starting_anything(
    args: tuple[str, ...], says: str
) -> None:
    """A malformed connection string went on to a traceback from the demo's own teardown
    (AttributeError: '_Sender' object has no attribute '_outbox'); a --work-dir that is a
    file, to FileExistsError."""
    code, output = run("demo", "--messages", "10", "--audit", "pyarrow", *args)
    assert code == 2 and says in output, output
    assert "Traceback" not in output


def test_the_demo_verdict_without_latency_figures_has_no_latency_row() -> None:
    """Regions that never answered leave an audit report with no latency quantiles: the
    verdict table raised KeyError: 'p50'."""
    from collections import Counter
    from pathlib import Path

    from georep.cli._demo import _verdict_rows
    from georep.cli._scenario import ScenarioConfig, ScenarioProgress, ScenarioResult

    config = ScenarioConfig(work_dir=Path(__file__), mode="passive", messages=1)
    result = ScenarioResult(
        config, Path(__file__), set(), Counter(), [], None, 0.0, ScenarioProgress()
    )
    rows = _verdict_rows(result, {"latency_ms": {"overall": {"count": 0}}}, 0, 0)
    assert not any(label.startswith("latency") for label, _ in rows)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--rate", "inf"), "--rate must be a finite number 0 or more, got inf"),
        (("--rate", "1", "--days", "0"), "--days must be a finite number greater than 0"),
        (("--rate", "1", "--ping-interval", "0"), "--ping-interval must be greater than 0"),
        (("--rate", "1", "--outage-minutes", "inf"), "--outage-minutes must be a finite"),
    ],
)
def test_cost_names_the_option_not_the_library_field(args: tuple[str, ...], says: str) -> None:
    """It said ``Workload.messages_per_second``, a name the command does not take."""
    code, output = run("cost", *args)
    assert code == 2 and says in output and "Workload." not in output, output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("demo", "--messages", "10", "--outage-at", "inf"), "--outage-at must be a finite"),
        (("demo", "--messages", "10", "--rate", "inf"), "--rate must be a finite"),
        (("soak", "--seconds", "inf"), "--seconds/--minutes must be a finite number"),
        (("soak", "--seconds", "5", "--report", __file__), "is a file: give a directory"),
    ],
)
def test_a_run_that_could_never_end_or_write_is_refused(args: tuple[str, ...], says: str) -> None:
    """``--outage-at inf`` ran a demo that never ended, ``soak --seconds inf`` faults for
    ever; a --report that is a file was a NotADirectoryError traceback."""
    code, output = run(*args)
    assert code == 2 and says in output, output


@pytest.mark.parametrize(
    "command", [["failover", "--to", "secondary"], ["pin", "--region", "primary"]]
)
def test_an_empty_entity_name_changes_no_role(command: list[str]) -> None:
    """``--entity ''`` made a role record with an empty name."""
    code, output = run(*command, "--entity", "", "--force", "--redis", "redis://127.0.0.1:1/0",
                       "--app", "x")  # fmt: skip
    assert code == 2 and "--entity '' names nothing" in output, output
