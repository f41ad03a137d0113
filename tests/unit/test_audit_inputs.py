"""``georep audit`` checks its inputs before Spark starts: exit 2 and one line, no traceback.

Exit status 1 means "messages were lost or processed twice"; a garbage file or a bad
``--outage`` used to crash after Spark had run, with a traceback and exit status 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from georep import ConfigurationError
from georep.adapters.spark import _audit, write_synthetic_ledger
from georep.cli import app


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that gets as far as starting Spark."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("Spark was started before the inputs were checked")

    monkeypatch.setattr(_audit, "spark_session", refuse)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return write_synthetic_ledger(tmp_path / "ledger", messages=50).path


def run(*arguments: str) -> Any:
    return CliRunner().invoke(app, ["audit", *arguments, "--no-plots"])


def assert_refused(result: Any, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "Spark was started" not in result.output
    text = " ".join(result.output.split())
    for fragment in fragments:
        assert fragment in text


def test_a_garbage_file_in_the_ledger_is_refused_before_spark(ledger: Path) -> None:
    (ledger / "sends" / "garbage.parquet").write_bytes(b"this is not parquet at all")
    assert_refused(run(str(ledger)), "garbage.parquet", "is not a Parquet file")


def test_a_parquet_file_that_is_not_a_ledger_file_is_refused(ledger: Path) -> None:
    pq.write_table(pa.table({"a": [1, 2]}), ledger / "receives" / "other.parquet")
    assert_refused(run(str(ledger)), "other.parquet", "no string message_id")


def test_an_empty_parquet_file_is_refused(ledger: Path) -> None:
    (ledger / "sends" / "empty.parquet").write_bytes(b"")
    assert_refused(run(str(ledger)), "empty.parquet")


@pytest.mark.parametrize(
    ("outage", "fragment"),
    [
        ("yesterday,today", "outage window"),
        ("2026-01-01T10:05:00Z,2026-01-01T10:00:00Z", "ends before it starts"),
        ("2026-01-01T10:00:00,2026-01-01T10:05:00", "no time zone"),
        ("2026-01-01T10:00:00Z", "START,END"),
        ("2026-01-01T10:00:00Z,2026-13-01T10:05:00Z", "outage window"),
    ],
)
def test_a_bad_outage_window_is_refused_before_spark(
    ledger: Path, outage: str, fragment: str
) -> None:
    assert_refused(run(str(ledger), "--outage", outage), fragment)


def test_a_ledger_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.parquet"
    path.write_bytes(b"x")
    assert_refused(run(str(path)), "does not exist")


def test_good_inputs_pass_the_check(ledger: Path) -> None:
    windows = _audit.check_audit_inputs(ledger, [("2026-01-01T10:00:00Z", "2026-01-01T10:05:00Z")])
    assert windows == [("2026-01-01T10:00:00Z", "2026-01-01T10:05:00Z")]


def test_the_api_raises_configuration_error_for_a_bad_window(ledger: Path) -> None:
    with pytest.raises(ConfigurationError, match="outage window"):
        _audit.audit(ledger, outage_windows=[("soon", "later")])


def test_a_crash_inside_the_audit_exits_2_not_1(
    ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exit status 1 means "messages lost": a failure of the audit itself must not say so.
    def crash(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("py4j gateway died\nline two")

    monkeypatch.setattr(_audit, "spark_session", crash)
    assert_refused(run(str(ledger)), "the audit could not run: RuntimeError: py4j gateway died")


def test_the_audit_job_module_exits_2_on_bad_input_and_on_a_crash(
    ledger: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from georep.adapters.spark import audit_job

    assert audit_job.main([str(ledger), "--outage", "soon,later", "--no-plots"]) == 2
    assert "outage window" in capsys.readouterr().err

    def crash(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("py4j gateway died")

    monkeypatch.setattr(_audit, "spark_session", crash)
    assert audit_job.main([str(ledger), "--no-plots"]) == 2
    assert "the audit could not run: RuntimeError" in capsys.readouterr().err
