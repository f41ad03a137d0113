"""The soak's checker: reads the delivery ledger after a run and judges it, per entity.

For each entity a receiver read (a queue, or each subscription of a topic) it reports:

- ``lost``: acknowledged to a sender (``accepted`` or ``queued``) and never processed;
- ``processed_twice``: processed by the handler more than once (``twice_after_kill`` of
  them are excused: see below);
- ``out_of_order``: handed to the handler after a later message of its session and writer;
- the audit's other figures (sent, processed, dead-lettered, send failures).

The counts come from the audit itself, run on each entity's slice of the ledger: the
single-machine reference audit (pyarrow + numpy) by default, the Spark audit with
``engine="spark"`` (the same figures by another route; Spark takes a while to start).

**What a SIGKILL does to the ledger.** A worker buffers ledger rows for a second; a
SIGKILL loses them. Its history (``history/*.jsonl``, written line by line and not lost)
says what it was acknowledged and what its handler finished, so the rows the ledger
lacks are recovered from it before the audit (counted in ``recovered_rows``; those of a
process that was *not* killed would be a ledger defect and are counted apart,
``unexplained_missing_rows``). A handler that finished and was killed before georep
committed the message has it processed again elsewhere: a duplicate the promise allows
(no system can commit a side effect and a message in one step). Those are
``twice_after_kill``: ids processed twice only because a recovered row of a killed
process counts once; every other duplicate is a violation.
"""

from __future__ import annotations

__all__ = ["EntityVerdict", "check_run", "read_history"]

import json
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from georep.exceptions import ConfigurationError


@dataclass
class EntityVerdict:
    """What the checker found for one received entity.

    The counts are the audit's figures (docs/audit.md) over this entity's slice of the
    ledger, once the rows recovered from the workers' histories are added to it.
    """

    entity: str
    """The entity received: a queue, or ``topic/Subscriptions/subscription``."""
    sent_entity: str
    """The entity its messages were sent to: the queue itself, or the topic."""
    sent: int = 0
    """Ids acknowledged to a sender (``accepted`` or ``queued``)."""
    processed: int = 0
    """Ids the handler processed at least once (sent or not)."""
    lost: int = 0
    """Sent ids never processed nor settled otherwise (dead-lettered, deferred, expired)."""
    processed_twice: int = 0
    """Ids processed two or more times, excused ones (``twice_after_kill``) included."""
    twice_after_kill: int = 0
    """Of ``processed_twice``, ids processed twice only because a killed process's handler
    finished before georep committed the message: duplicates the promise allows."""
    out_of_order: int = 0
    """Processed copies handed on after a later message of their session and writer."""
    dead_lettered: int = 0
    """Sent ids not processed but dead-lettered (held by the broker, so not lost)."""
    send_failed: int = 0
    """Ids sent and never acknowledged: the caller got an error (never counted lost)."""
    sessions: int = 0
    """Distinct session ids among the processed copies (0 without sessions)."""
    order_gaps: dict[str, int] = field(default_factory=dict)
    """Processed copies handed on without their predecessor processed, by reason
    (``timeout`` or ``absent``)."""
    recovered_rows: int = 0
    """Processed rows the ledger lacked and a worker's history supplied."""
    unexplained_missing_rows: int = 0
    """Of ``recovered_rows``, those of a process that was not killed: a ledger defect."""
    lost_ids: list[str] = field(default_factory=list)
    """The first 20 ids behind ``lost``, in sorted order."""
    twice_ids: list[str] = field(default_factory=list)
    """The first 20 ids processed twice and not excused by a kill, in sorted order."""

    @property
    def violations(self) -> int:
        """Lost, processed twice (not excused), out of order."""
        return self.lost + (self.processed_twice - self.twice_after_kill) + self.out_of_order

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "violations": self.violations}


def read_history(history_dir: Path) -> list[dict[str, Any]]:
    """Every line of every worker's history (a torn last line, from a SIGKILL, is skipped)."""
    events: list[dict[str, Any]] = []
    for path in sorted(history_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def check_run(
    ledger_dir: Path,
    entities: Mapping[str, str],
    *,
    history: Iterable[Mapping[str, Any]] = (),
    killed_pids: Iterable[int] = (),
    work_dir: Path,
    engine: str = "pyarrow",
) -> list[EntityVerdict]:
    """Judge a run's ledger, one verdict per received entity.

    Args:
        ledger_dir: The run's ledger (every process's files).
        entities: Each received entity (``queue`` or ``topic/Subscriptions/sub``) to the
            entity its messages were sent to.
        history: The workers' history events (:func:`read_history`).
        killed_pids: Processes the nemesis SIGKILLed.
        work_dir: Where each entity's slice of the ledger is written for the audit.
        engine: ``pyarrow`` (the reference audit) or ``spark``.

    Raises:
        ConfigurationError: An unknown engine, or no ledger in ``ledger_dir``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from georep.ledger.schema import receive_schema, send_schema

    if engine not in ("pyarrow", "spark"):
        raise ConfigurationError(f"engine must be 'pyarrow' or 'spark', not {engine!r}")
    send_files = sorted(str(p) for p in (ledger_dir / "sends").glob("*.parquet"))
    receive_files = sorted(str(p) for p in (ledger_dir / "receives").glob("*.parquet"))
    if not send_files and not receive_files:
        raise ConfigurationError(f"no ledger in {ledger_dir}: did the soak run?")

    def read(files: list[str], schema: pa.Schema) -> pa.Table:
        if not files:
            return schema.empty_table()
        return ds.dataset(files, schema=schema, format="parquet").to_table()

    sends, receives = read(send_files, send_schema()), read(receive_files, receive_schema())
    killed = set(killed_pids)
    extra_sends, extra_receives, recovered = _recovered_rows(sends, receives, history, killed)
    if extra_sends:
        sends = pa.concat_tables([sends, pa.Table.from_pylist(extra_sends, send_schema())])
    if extra_receives:
        receives = pa.concat_tables(
            [receives, pa.Table.from_pylist(extra_receives, receive_schema())]
        )
    aggregate = _engine(engine)
    verdicts = []
    for index, (entity, sent_entity) in enumerate(sorted(entities.items())):
        piece = work_dir / f"{index:02d}-{entity.replace('/', '_')}"
        shutil.rmtree(piece, ignore_errors=True)
        for name, table, column, value in (
            ("sends", sends, "entity", sent_entity),
            ("receives", receives, "entity", entity),
        ):
            (piece / name).mkdir(parents=True)
            pq.write_table(table.filter(pc.equal(table[column], value)), piece / name / "p.parquet")
        figures = aggregate(piece)
        rows, unexplained, recovered_ids = recovered.get(entity, (0, 0, set()))
        verdict = EntityVerdict(
            entity=entity,
            sent_entity=sent_entity,
            sent=figures.sent,
            processed=figures.processed,
            lost=figures.lost,
            processed_twice=figures.processed_more_than_once,
            out_of_order=sum(figures.out_of_session_order.values()),
            dead_lettered=figures.dead_lettered,
            send_failed=figures.send_failed,
            sessions=figures.sessions,
            order_gaps=dict(figures.order_gaps),
            recovered_rows=rows,
            unexplained_missing_rows=unexplained,
        )
        _name_the_ids(verdict, sends, receives, recovered_ids=recovered_ids, killed=killed)
        verdicts.append(verdict)
    return verdicts


def _engine(engine: str) -> Any:
    if engine == "pyarrow":
        from georep.adapters.spark import reference_aggregates

        return reference_aggregates
    from georep.adapters.spark import spark_aggregates, spark_session

    spark = spark_session("local[1]")
    return lambda piece: spark_aggregates(spark, piece)


def _recovered_rows(
    sends: Any, receives: Any, history: Iterable[Mapping[str, Any]], killed: set[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, tuple[int, int, set[str]]]]:
    """Ledger rows a worker's history has and its ledger lacks: (send rows, receive rows,
    per received entity (rows recovered, of them from processes not killed, their ids))."""
    from georep.ledger.schema import SCHEMA_VERSION

    acked = set(zip(sends["entity"].to_pylist(), sends["message_id"].to_pylist(), strict=True))
    processed = {
        (entity, message_id, pid)
        for entity, message_id, pid, outcome in zip(
            receives["entity"].to_pylist(),
            receives["message_id"].to_pylist(),
            receives["process_id"].to_pylist(),
            receives["outcome"].to_pylist(),
            strict=True,
        )
        if outcome == "processed"
    }
    extra_sends: list[dict[str, Any]] = []
    extra_receives: list[dict[str, Any]] = []
    counts: dict[str, list[Any]] = defaultdict(lambda: [0, 0, set()])
    for event in history:
        at = datetime.fromtimestamp(float(event["t"]), UTC)
        if event["ev"] == "ack" and (event["entity"], event["id"]) not in acked:
            acked.add((event["entity"], event["id"]))
            extra_sends.append(
                {
                    "schema_version": SCHEMA_VERSION,
                    "message_id": event["id"],
                    "entity": event["entity"],
                    "mode": event.get("mode", "passive"),
                    "outcome": "queued" if event.get("queued") else "accepted",
                    "started_at": at,
                    "finished_at": at,
                    "process_id": event["pid"],
                }
            )
        elif event["ev"] == "handled":
            key = (event["entity"], event["id"], event["pid"])
            if key in processed:
                continue
            processed.add(key)
            extra_receives.append(
                {
                    "schema_version": SCHEMA_VERSION,
                    "message_id": event["id"],
                    "entity": event["entity"],
                    "region": "unknown",
                    "outcome": "processed",
                    "received_at": at,
                    "finished_at": at,
                    "process_id": event["pid"],
                    "session_id": event.get("session"),
                }
            )
            count = counts[event["entity"]]
            count[0] += 1
            if event["pid"] in killed:
                count[2].add(event["id"])
            else:
                count[1] += 1
    return extra_sends, extra_receives, {k: (v[0], v[1], v[2]) for k, v in counts.items()}


def _name_the_ids(
    verdict: EntityVerdict, sends: Any, receives: Any, *, recovered_ids: set[str], killed: set[int]
) -> None:
    """The ids behind ``lost`` and ``processed_twice`` (the first 20 of each), and how many
    duplicates a kill explains."""
    import pyarrow.compute as pc

    rows = receives.filter(
        pc.and_(
            pc.equal(receives["entity"], verdict.entity), pc.equal(receives["outcome"], "processed")
        )
    )
    copies = Counter(rows["message_id"].to_pylist())
    # A copy recovered from a killed process's history: its handler ran, georep had not
    # committed it when the process died.
    from_killed = Counter(
        message_id
        for message_id, pid, region in zip(
            rows["message_id"].to_pylist(),
            rows["process_id"].to_pylist(),
            rows["region"].to_pylist(),
            strict=True,
        )
        if region == "unknown" and pid in killed and message_id in recovered_ids
    )
    twice = sorted(m for m, n in copies.items() if n > 1)
    verdict.twice_after_kill = sum(1 for m in twice if copies[m] - from_killed[m] <= 1)
    verdict.twice_ids = [m for m in twice if copies[m] - from_killed[m] > 1][:20]
    acked = sends.filter(
        pc.and_(
            pc.equal(sends["entity"], verdict.sent_entity),
            pc.is_in(sends["outcome"], value_set=_strings(["accepted", "queued"])),
        )
    )
    mine = receives.filter(pc.equal(receives["entity"], verdict.entity))
    settled = mine.filter(
        pc.is_in(mine["outcome"], value_set=_strings(["processed", "dead_lettered", "deferred"]))
    )
    expired = sends.filter(pc.equal(sends["outcome"], "expired"))["message_id"].to_pylist()
    unsettled = set(acked["message_id"].to_pylist()) - set(settled["message_id"].to_pylist())
    verdict.lost_ids = sorted(unsettled - set(expired))[:20]


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, type=pa.string())
