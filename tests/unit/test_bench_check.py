"""The benchmark regression check's judgement (benchmarks/_record.py, benchmarks/check.py):
a ratio that falls further than its band fails, one within it passes, a failing benchmark
is judged on the best of its runs, and a missing baseline is a clear error. No benchmark
runs here: the quick runs are replaced by their figures."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    """benchmarks/_record.py and benchmarks/check.py, imported as the scripts import them."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    record, check = importlib.import_module("_record"), importlib.import_module("check")
    yield record, check


def _baseline(mean: float = 1.0, band: float = 0.15) -> dict:
    """Five equal runs of ``mean``: the band the check uses is the least, 0.15 of the mean
    (``band`` is what an older baseline file stored; the check recomputes it from the runs)."""
    stats = {"mean": mean, "band": band, "runs": [mean] * 5, "spread": 0.0, "stdev": 0.0}
    return {"benchmarks": {"sender": {"command": "x", "ratios": {"passive": stats}}}}


def test_a_drop_beyond_the_band_fails_and_within_it_passes(bench: tuple) -> None:
    record, _ = bench
    baseline = _baseline(mean=1.0)

    [within] = record.compare(baseline, "sender", {"passive": 0.86})
    [beyond] = record.compare(baseline, "sender", {"passive": 0.84})

    assert within.passed and not beyond.passed
    assert "FAIL" in beyond.row() and "1.00" in beyond.row() and "0.84" in beyond.row()


def test_the_band_comes_from_the_runs_not_from_what_the_file_stored(bench: tuple) -> None:
    record, _ = bench
    narrow = _baseline(mean=1.0, band=0.05)  # recorded under an older, narrower rule

    [verdict] = record.compare(narrow, "sender", {"passive": 0.9})

    assert verdict.passed and verdict.band == pytest.approx(0.15)


def test_a_ratio_the_run_did_not_report_fails_as_missing(bench: tuple) -> None:
    record, _ = bench

    [verdict] = record.compare(_baseline(), "sender", {"something else": 2.0})

    assert not verdict.passed and "missing" in verdict.row()


def test_a_missing_baseline_file_says_how_to_record_one(bench: tuple, tmp_path: Path) -> None:
    record, _ = bench

    with pytest.raises(record.BaselineError, match=r"check\.py --baseline"):
        record.load_baseline(tmp_path / "baseline.json")


def test_a_benchmark_missing_from_the_baseline_is_named(bench: tuple) -> None:
    record, _ = bench

    with pytest.raises(record.BaselineError, match=r"no benchmark 'receiver'.*--only receiver"):
        record.compare(_baseline(), "receiver", {"x": 1.0})


def test_the_band_is_three_sigmas_or_fifteen_hundredths_of_the_mean_whichever_is_wider(
    bench: tuple,
) -> None:
    record, _ = bench

    assert record.band([1.0, 1.0, 1.0, 1.0, 1.0]) == pytest.approx(0.15)
    noisy = [0.8, 1.0, 1.2, 0.9, 1.1]  # stdev 0.158
    assert record.band(noisy) == pytest.approx(3 * 0.1581, abs=1e-3)
    with pytest.raises(ValueError, match="at least two runs"):
        record.band([1.0])


def test_a_failing_benchmark_runs_again_and_is_judged_on_its_best(
    bench: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, check = bench
    runs = iter([{"passive": 0.7}, {"passive": 0.95}])
    monkeypatch.setattr(check, "run_quick", lambda name: next(runs))

    [verdict] = check.check(["sender"], _baseline(), retries=1)

    assert verdict.passed and verdict.now == 0.95


def test_a_regression_fails_both_runs(bench: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    _, check = bench
    calls: list[str] = []

    def run(name: str) -> dict[str, float]:
        calls.append(name)
        return {"passive": 0.75}

    monkeypatch.setattr(check, "run_quick", run)

    [verdict] = check.check(["sender"], _baseline(), retries=1)

    assert not verdict.passed and calls == ["sender", "sender"]


def test_the_command_exits_non_zero_on_a_regression_and_prints_the_figures(
    bench: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _, check = bench
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(_baseline(mean=1.2)))
    monkeypatch.setattr(check, "run_quick", lambda name: {"passive": 0.8})

    code = check.main(["--only", "sender", "--file", str(baseline), "--retries", "0"])

    out = capsys.readouterr().out
    assert code == 1
    assert "baseline" in out and "1.20" in out and "0.18" in out and "0.80" in out


def test_the_command_exits_2_without_a_baseline(
    bench: tuple, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _, check = bench

    code = check.main(["--file", str(tmp_path / "none.json")])

    assert code == 2 and "no baseline at" in capsys.readouterr().err


def test_the_summary_block_is_replaced_in_place_and_kept_by_georep_bench(bench: tuple) -> None:
    from georep.cli._bench import _record_block

    record, _ = bench
    first = record.replace_block("# summary\n\nscenarios\n", "old figures")
    second = record.replace_block(first + "\nafter\n", "new figures")

    assert "old figures" not in second and "new figures" in second
    assert second.startswith("# summary") and second.rstrip().endswith("after")
    kept = _record_block(second)
    assert kept.startswith(record.BLOCK_BEGIN) and kept.endswith(record.BLOCK_END)
    assert "new figures" in kept
    with pytest.raises(ValueError, match="unbalanced"):
        record.replace_block(record.BLOCK_BEGIN + "\nno end\n", "x")


def test_a_quick_run_is_read_back_from_the_record_it_writes(
    bench: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, check = bench
    script = tmp_path / "fake_bench.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "from _record import write_record\n"
        "write_record('fake', quick=True, ratios={'r': 1.5}, figures={'argv': sys.argv[1:]})\n"
    )
    monkeypatch.setitem(check.QUICK, "fake", [str(script), "--quick"])

    assert check.run_quick("fake") == {"r": 1.5}
    assert not (BENCHMARKS / "results" / "quick" / "fake.json").exists()  # a temp dir


def test_a_quick_run_that_crashes_is_reported_with_its_output(
    bench: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, check = bench
    script = tmp_path / "broken_bench.py"
    script.write_text("raise SystemExit('no emulator here')\n")
    monkeypatch.setitem(check.QUICK, "broken", [str(script)])

    with pytest.raises(check.BenchmarkFailed, match="broken exited with 1:\nno emulator here"):
        check.run_quick("broken")
