"""``georep fault``: a fault's options are checked before the emulator is contacted."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from georep.cli import app

# Nothing listens here: a command that got past its checks would say no emulator answers.
NOWHERE = ("--control-url", "http://127.0.0.1:1", "--control-token", "t")


def fault(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["fault", *args, *NOWHERE], env={"COLUMNS": "200"})
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # Before: exit 0 and latency 0, a silent no-op.
        (("latency",), "latency needs --seconds: the seconds added before every response"),
        (("reject-sends",), "reject-sends needs --condition: server-busy, timeout,"),
        (("relay-no-listener",), "relay-no-listener needs --path: the hybrid connection"),
        (("session-lock-lost",), "session-lock-lost needs --entity: the session-enabled queue"),
        (("fragment-down", "--entity", "p"), "fragment-down needs --index: the partitioned"),
        (("fragment-up",), "fragment-up needs --entity and --index"),
        (("outage", "--seconds", "3"), "outage takes no option, not --seconds"),
        (("latency", "--seconds", "1", "--count", "2"), "latency takes --seconds, not --count"),
        (("restore", "--off"), "restore takes no option, not --off"),
        (("meteor",), "unknown fault 'meteor'; one of outage, restore, blackhole, latency"),
    ],
)
def test_a_missing_or_foreign_option_is_refused_before_the_emulator_is_contacted(
    args: tuple[str, ...], said: str
) -> None:
    code, output = fault("primary", *args)
    assert code == 2, output
    assert said in output
    assert "no emulator answers" not in output


@pytest.mark.parametrize(
    "args",
    [
        ("latency", "--seconds", "0.2"),
        ("drop-dispositions",),
        ("lose-settlements", "--count", "2"),
        ("relay-no-listener", "--path", "svc", "--off"),
        ("fragment-down", "--entity", "p", "--index", "3"),
        ("outage",),
    ],
)
def test_complete_options_go_to_the_emulator(args: tuple[str, ...]) -> None:
    code, output = fault("primary", *args)
    assert code == 1 and "no emulator answers at http://127.0.0.1:1" in output
