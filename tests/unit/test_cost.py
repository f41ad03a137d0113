"""georep cost reproduces the seeds' figures (SPEC §3, §7)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from georep.cli import app
from georep.cli._cost import Workload, estimate_cost, estimate_costs, syphon_receive_calls
from georep.exceptions import ConfigurationError


def test_active_replication_costs_twice_the_operations_of_passive() -> None:
    workload = Workload(messages_per_second=25, outage_minutes_per_month=90)
    passive = estimate_cost(workload, "passive")
    active = estimate_cost(workload, "active")
    assert active.total_operations == 2 * passive.total_operations
    assert passive.total_operations == estimate_cost(workload, "unreplicated").total_operations


def test_a_message_is_one_send_and_one_receive_per_started_64_kb() -> None:
    month = 30 * 86_400
    assert estimate_cost(Workload(messages_per_second=1), "passive").total_operations == (2 * month)
    large = Workload(messages_per_second=1, message_size_bytes=64 * 1024 + 1)
    assert estimate_cost(large, "passive").total_operations == 4 * month


@pytest.mark.parametrize(
    ("days", "expected"), [(1 / 24, 40), (1, 960), (30, 28_800)], ids=["hour", "day", "30 days"]
)
def test_syphon_with_ten_backlog_queues_makes_the_seeds_receive_calls(
    days: float, expected: int
) -> None:
    workload = Workload(messages_per_second=0, backlog_queue_count=10, days=days)
    assert estimate_cost(workload, "paired").syphon_receive_calls == pytest.approx(expected)
    assert syphon_receive_calls(workload, 3600) == pytest.approx(40)


def test_pings_once_a_minute_per_unavailable_entity_and_sender() -> None:
    workload = Workload(messages_per_second=0, outage_minutes_per_month=120, entities=3, senders=2)
    assert estimate_cost(workload, "paired").ping_operations == 120 * 3 * 2
    assert estimate_cost(workload, "active").ping_operations == 0
    faster = Workload(
        messages_per_second=0,
        outage_minutes_per_month=10,
        ping_primary_interval=timedelta(seconds=30),
    )
    assert estimate_cost(faster, "paired").ping_operations == 20


def test_each_syphoned_message_costs_four_operations() -> None:
    workload = Workload(messages_per_second=2, outage_minutes_per_month=60, syphon_hosts=0)
    paired = estimate_cost(workload, "paired")
    backlogged = 2 * 3600
    assert paired.backlog_operations == 4 * backlogged
    assert paired.message_operations == 2 * (2 * 30 * 86_400 - backlogged)
    assert paired.total_operations == pytest.approx(
        estimate_cost(workload, "passive").total_operations + 2 * backlogged + 60
    )


def test_amount_is_priced_per_million_operations() -> None:
    workload = Workload(messages_per_second=1, price_per_million=0.5)
    estimate = estimate_cost(workload, "active")
    assert estimate.amount(0.5) == pytest.approx(4 * 30 * 86_400 / 1_000_000 * 0.5)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("messages_per_second", -1, "messages_per_second"),
        ("entities", 0, "entities"),
        ("days", 0, "days"),
        ("outage_minutes_per_month", 31 * 24 * 60, "longer than the period"),
        ("ping_primary_interval", 0, "ping_primary_interval"),
    ],
)
def test_bad_workload_names_the_field(field: str, value: float, named: str) -> None:
    arguments: dict[str, float] = {"messages_per_second": 1, field: value}
    with pytest.raises(ConfigurationError, match=named):
        Workload(**arguments)  # type: ignore[arg-type]


def test_unknown_mode_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match="unreplicated, passive, active, paired"):
        estimate_costs(Workload(messages_per_second=1), ("geo",))


def test_cli_prints_every_mode_side_by_side_and_json() -> None:
    runner = CliRunner()
    table = runner.invoke(app, ["cost", "--rate", "10", "--outage-minutes", "60"])
    assert table.exit_code == 0, table.output
    for mode in ("unreplicated", "passive", "active", "paired"):
        assert mode in table.output
    assert "28,800" in table.output
    result = runner.invoke(
        app, ["cost", "--rate", "0", "--json", "--mode", "paired", "--outage-minutes", "60"]
    )
    assert result.exit_code == 0, result.output
    paired = json.loads(result.output)["paired"]
    assert paired["syphon_receive_calls"] == 28_800
    assert paired["ping_operations"] == 60


def test_cli_refuses_an_unknown_mode_with_exit_status_2() -> None:
    result = CliRunner().invoke(app, ["cost", "--rate", "1", "--mode", "geo"])
    assert result.exit_code == 2
    assert "unknown mode" in result.output


@pytest.mark.parametrize(
    "option",
    ["--rate", "--outage-minutes", "--ping-interval", "--days", "--price-per-million"],
)
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_cli_refuses_non_finite_numbers_with_exit_status_2(option: str, value: str) -> None:
    arguments = ["cost", "--rate", "1", option, value]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2, result.output
    # Refused with a message, before any estimate is printed.
    assert "total operations" not in result.output and "Infinity" not in result.output


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0, "1", True])
@pytest.mark.parametrize(
    "field", ["messages_per_second", "days", "price_per_million", "outage_minutes_per_month"]
)
def test_workload_numbers_must_be_finite(field: str, value: object) -> None:
    arguments: dict[str, object] = {"messages_per_second": 1, field: value}
    with pytest.raises(ConfigurationError, match=rf"Workload\.{field}"):
        Workload(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [2.5, True, "3", -1])
def test_workload_counts_must_be_ints(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"Workload\.entities"):
        Workload(messages_per_second=1, entities=value)  # type: ignore[arg-type]


def test_a_workload_whose_totals_overflow_is_refused_not_priced_as_inf() -> None:
    # 1e308 messages a second is a finite rate; its month is not (a table of "inf" before).
    with pytest.raises(ConfigurationError, match="too large to count"):
        estimate_costs(Workload(messages_per_second=1e308))
    result = CliRunner().invoke(app, ["cost", "--rate", "1e308"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "too large to count" in result.output
    assert "inf" not in result.output
