"""The soak's nemesis schedule: the same seed gives the same faults, every kind is drawn,
faults overlap; and the nemesis plays a schedule on a virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from georep import ConfigurationError
from georep.cli.soak.nemesis import Nemesis
from georep.cli.soak.schedule import FAULT_KINDS, Fault, check_kinds, draw_schedule
from georep.testing import FakeClock


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    first = draw_schedule(7, 60, ["all"])
    assert first == draw_schedule(7, 60, ["all"])
    assert first != draw_schedule(8, 60, ["all"])


@pytest.mark.parametrize("seed", range(20))
def test_every_kind_asked_for_is_drawn_and_every_fault_ends_in_time(seed: int) -> None:
    schedule = draw_schedule(seed, 60, ["all"])
    assert {f.kind for f in schedule} == set(FAULT_KINDS)
    assert all(0 <= f.at < f.ends <= 60 + 1e-9 for f in schedule)
    assert schedule == sorted(schedule, key=lambda f: (f.at, f.kind))


def test_faults_overlap() -> None:
    overlapping = 0
    for seed in range(10):
        schedule = draw_schedule(seed, 60, ["all"])
        overlapping += sum(
            1 for a in schedule for b in schedule if a is not b and a.at <= b.at < a.ends
        )
    assert overlapping > 0


def test_a_subset_of_kinds_draws_only_those() -> None:
    schedule = draw_schedule(3, 30, ["outage", "kill-sender"])
    assert {f.kind for f in schedule} == {"outage", "kill-sender"}


def test_an_unknown_kind_or_a_run_too_short_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown fault kind 'flood'.*outage"):
        check_kinds(["outage", "flood"])
    with pytest.raises(ConfigurationError, match="at least 3 s"):
        draw_schedule(1, 2, ["outage"])
    with pytest.raises(ConfigurationError, match="at least one fault kind"):
        draw_schedule(1, 30, [])


class _Namespace:
    def __init__(
        self,
        region: str,
        calls: list[tuple[float, str, str]],
        clock: FakeClock,
        arguments: list[tuple[Any, ...]] | None = None,
    ) -> None:
        self.region, self.calls, self.clock = region, calls, clock
        self.arguments = arguments if arguments is not None else []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> int:
            self.calls.append((self.clock.monotonic(), self.region, name))
            self.arguments.append(args)
            return 0

        return call


class _Targets:
    def __init__(self, clock: FakeClock) -> None:
        self.calls: list[tuple[float, str, str]] = []
        self.arguments: list[tuple[Any, ...]] = []
        self.clock = clock

    def namespace(self, region: str) -> _Namespace:
        return _Namespace(region, self.calls, self.clock, self.arguments)

    def fragment(self, target: int) -> tuple[str, int]:
        return "orders", target % 16

    def kill(self, group: str, index: int) -> str:
        self.calls.append((self.clock.monotonic(), group, "kill"))
        return f"{group}-{index}"

    def restart(self, name: str) -> None:
        self.calls.append((self.clock.monotonic(), name, "restart"))

    def outbox_disk_full(self, full: bool) -> int:
        self.calls.append((self.clock.monotonic(), "disk", "fill" if full else "empty"))
        return 4096 if full else 0

    def stop(self, index: int) -> tuple[str, float | None]:
        self.calls.append((self.clock.monotonic(), f"any-{index}", "stop"))
        return f"any-{index}", None if index == 13 else 2.5

    def roles(self) -> Any:
        raise RuntimeError("the store is down")

    def redis(self, target: int) -> Any:
        server = _Namespace(f"redis-{target % 4}", self.calls, self.clock)
        server.name = f"redis-{target % 4}"
        return server


def _play(schedule: list[Fault], targets: _Targets, clock: FakeClock) -> Nemesis:
    """Play ``schedule`` on the fake clock for 10 s, every blocking call made directly."""

    async def direct(function: Any, *args: Any) -> Any:
        return function(*args)

    async def play() -> Nemesis:
        nemesis = Nemesis(schedule, targets, clock=clock.monotonic, sleep=clock.sleep, call=direct)
        run = asyncio.create_task(nemesis.run())
        await clock.advance(10)
        await run
        return nemesis

    return asyncio.run(play())


def test_the_nemesis_ends_an_overlapped_fault_by_restoring_and_injecting_the_rest_again() -> None:
    clock = FakeClock()
    targets = _Targets(clock)
    schedule = [
        Fault(at=1, kind="outage", length=5, region="primary"),
        Fault(at=2, kind="reject-sends", length=2, region="primary"),
        Fault(at=3, kind="kill-sender", length=1, target=4),
        Fault(at=3.5, kind="failover", length=1),
    ]

    nemesis = _play(schedule, targets, clock)
    primary = [(t, name) for t, region, name in targets.calls if region == "primary"]
    # reject-sends ends at 4: restore, then the outage (still running) again; at 6 restore.
    assert primary == [
        (1, "outage"),
        (2, "reject_sends"),
        (4, "restore"),
        (4, "outage"),
        (6, "restore"),
    ]
    assert (3, "sender", "kill") in targets.calls and (4, "sender-4", "restart") in targets.calls
    failover = next(entry for entry in nemesis.log if entry["kind"] == "failover")
    assert failover["error"] == "RuntimeError: the store is down"


def test_a_fragment_down_is_taken_down_again_when_an_overlapping_fault_restores_its_region() -> (
    None
):
    clock = FakeClock()
    targets = _Targets(clock)
    schedule = [
        Fault(at=1, kind="outage", length=2, region="secondary"),
        Fault(at=2, kind="fragment-down", length=3, region="secondary", target=21),
    ]

    nemesis = _play(schedule, targets, clock)
    assert [(t, name) for t, _, name in targets.calls] == [
        (1, "outage"),
        (2, "fragment_down"),
        (3, "restore"),  # the outage ends: every fault of the region ends with it...
        (3, "fragment_down"),  # ...and the fragment, still down by the schedule, again
        (5, "restore"),
    ]
    assert targets.arguments[1] == targets.arguments[3] == ("orders", 5)
    entry = next(e for e in nemesis.log if e["kind"] == "fragment-down")
    assert (entry["entity"], entry["fragment"]) == ("orders", 5)


def test_a_fragment_down_hits_every_fragment_of_the_queue_or_one_a_session_lives_in(
    tmp_path: Any,
) -> None:
    import zlib

    from georep.cli.soak.runner import QUEUE, SESSION_QUEUE, SESSIONS, SoakConfig, _Soak

    soak = _Soak(SoakConfig(seconds=10, seed=1, report_dir=tmp_path), tmp_path)
    hit = [soak.fragment(target) for target in range(1_000)]
    assert {index for entity, index in hit if entity == QUEUE} == set(range(16))
    sessions = [s for group in SESSIONS.values() for s in group]
    in_use = {zlib.crc32(s.encode()) % 16 for s in sessions}
    assert {index for entity, index in hit if entity == SESSION_QUEUE} == in_use
    assert {entity for entity, _ in hit} == {QUEUE, SESSION_QUEUE}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--faults", "flood"], "unknown fault kind 'flood'"),
        (["--seconds", "20", "--minutes", "1"], "give --seconds or --minutes, not both"),
        (["--audit", "duckdb"], "--audit must be pyarrow or spark"),
        (["--faults", "outage,flood"], "unknown fault kind 'flood'"),
        # What the user typed is quoted as it is, not read as rich markup (a MarkupError
        # traceback, before; "[bold]" vanished).
        (["--faults", "flood[/x]"], "unknown fault kind 'flood[/x]'"),
        (["--faults", "[bold]flood"], "unknown fault kind '[bold]flood'"),
    ],
)
def test_the_soak_command_refuses_bad_input_before_starting_anything(
    args: list[str], said: str, tmp_path: Any
) -> None:
    from typer.testing import CliRunner

    from georep.cli import app

    result = CliRunner().invoke(
        app, ["soak", *args, "--report", str(tmp_path / "r")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2 and said in result.output
    assert not (tmp_path / "r").exists()


def test_the_soak_command_lists_the_fault_kinds() -> None:
    from typer.testing import CliRunner

    from georep.cli import app

    result = CliRunner().invoke(app, ["soak", "--faults", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert all(kind in result.output for kind in FAULT_KINDS)


def test_a_report_directory_with_other_files_is_refused_not_emptied(tmp_path: Any) -> None:
    from georep.cli.soak.runner import SoakConfig, run_soak

    (tmp_path / "notes.txt").write_text("mine")
    config = SoakConfig(seconds=10, seed=1, report_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="not empty and holds no earlier soak report"):
        asyncio.run(run_soak(config))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_stop_fault_logs_how_long_the_process_took_to_exit_and_starts_it_again() -> None:
    clock = FakeClock()
    targets = _Targets(clock)
    schedule = [
        Fault(at=1, kind="stop-worker", length=3, target=2),
        Fault(at=2, kind="stop-worker", length=3, target=13),
    ]

    nemesis = _play(schedule, targets, clock)
    assert [(t, name, what) for t, name, what in targets.calls] == [
        (1, "any-2", "stop"),
        (2, "any-13", "stop"),
        (4, "any-2", "restart"),
        (5, "any-13", "restart"),
    ]
    assert [(e["process"], e["exit_seconds"]) for e in nemesis.log] == [
        ("any-2", 2.5),
        ("any-13", None),
    ]


def test_a_full_outbox_disk_fault_fills_the_disk_and_gives_the_space_back_when_it_ends() -> None:
    clock = FakeClock()
    targets = _Targets(clock)

    nemesis = _play([Fault(at=2, kind="full-outbox-disk", length=4)], targets, clock)
    assert targets.calls == [(2, "disk", "fill"), (6, "disk", "empty")]
    assert nemesis.log[0]["bytes"] == 4096


def test_overlapping_disk_faults_give_the_disk_back_when_the_last_one_ends(tmp_path: Any) -> None:
    from georep.cli.soak.runner import SoakConfig, _Soak

    class Disk:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def fill(self) -> int:
            self.calls.append("fill")
            return 1 if self.calls.count("fill") == 1 else 0  # the second finds it full

        def empty(self) -> None:
            self.calls.append("empty")

    soak = _Soak(SoakConfig(seconds=10, seed=1, report_dir=tmp_path), tmp_path)
    disk = Disk()
    soak.outbox_disk = disk  # type: ignore[assignment]
    assert soak.outbox_disk_full(True) == 1
    assert soak.outbox_disk_full(True) == 0
    soak.outbox_disk_full(False)
    assert disk.calls == ["fill", "fill"]  # the other fault still runs: still full
    soak.outbox_disk_full(False)
    assert disk.calls == ["fill", "fill", "empty"]


def test_redis_faults_hit_the_server_their_target_names_and_log_which() -> None:
    clock = FakeClock()
    targets = _Targets(clock)
    schedule = [
        Fault(at=1, kind="redis-unreachable", length=2, target=6),
        Fault(at=2, kind="redis-restart", length=1, target=3),
    ]

    nemesis = _play(schedule, targets, clock)
    assert [(t, server, what) for t, server, what in targets.calls] == [
        (1, "redis-2", "pause"),
        (2, "redis-3", "restart"),
        (3, "redis-2", "resume"),
    ]
    assert [e["server"] for e in nemesis.log] == ["redis-2", "redis-3"]


def test_the_replay_command_gives_the_kinds_as_the_cli_takes_them_and_the_seen_set(
    tmp_path: Any,
) -> None:
    from georep.cli.soak.report import replay_command
    from georep.cli.soak.runner import SoakConfig, SoakResult

    config = SoakConfig(
        seconds=30, seed=9, report_dir=tmp_path, kinds=("outage", "kill-sender"), seen_set="cluster"
    )
    result = SoakResult(config, [], [], [], {}, {}, None)
    command = replay_command(result)
    assert "--faults outage,kill-sender --seen-set cluster" in command
    assert command.startswith("georep soak --seconds 30 --seed 9 ")
