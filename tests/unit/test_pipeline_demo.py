"""``georep demo --pipeline``'s parts that need no Spark: its options, and following a file
sink's commit log to the MessageIds of the committed micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from georep.adapters.spark._table_audit import CommittedRows
from georep.cli._scenario import ScenarioConfig
from georep.exceptions import ConfigurationError


@pytest.mark.parametrize(("mode", "sessions"), [("paired", 0), ("raw", 0), ("passive", 5)])
def test_the_pipeline_needs_passive_or_active_mode_without_sessions(
    tmp_path: Path, mode: str, sessions: int
) -> None:
    with pytest.raises(ConfigurationError, match="--pipeline needs mode passive or active"):
        ScenarioConfig(work_dir=tmp_path, mode=mode, sessions=sessions, pipeline=True)


def _part(table: Path, name: str, ids: list[str]) -> str:
    path = table / name
    pq.write_table(pa.table({"message_id": ids}), path)
    return path.as_uri()


def _log(table: Path, name: str, *entries: tuple[str, str]) -> None:
    lines = ["v1"] + [json.dumps({"path": path, "action": action}) for path, action in entries]
    (table / "_spark_metadata" / name).write_text("\n".join(lines) + "\n")


def test_only_the_files_the_sink_log_lists_are_counted(tmp_path: Path) -> None:
    table = tmp_path / "table"
    (table / "_spark_metadata").mkdir(parents=True)
    rows = CommittedRows(table)
    first = _part(table, "part-0.parquet", ["a", "b"])
    _part(table, "part-orphan.parquet", ["b", "c"])  # written by a killed driver, never listed
    assert rows.refresh() == {}
    _log(table, "0", (first, "add"))
    assert rows.refresh() == {"a": 1, "b": 1}
    second = _part(table, "part-1.parquet", ["b", "d"])
    _log(table, ".1.tmp", (second, "add"))  # the log file is still being written
    assert rows.refresh() == {"a": 1, "b": 1}
    _log(table, "1", (second, "add"))
    assert rows.refresh() == {"a": 1, "b": 2, "d": 1}
    # A compaction repeats earlier entries; nothing is counted twice.
    _log(table, "2.compact", (first, "add"), (second, "add"))
    assert rows.refresh() == {"a": 1, "b": 2, "d": 1}
