"""The ledger audit as a PySpark job (docs/audit.md has the definitions).

Three jobs, each reading only the columns it needs:

1. sends: one aggregation by (second, accepted region, mode, failover, duration bucket),
   then grouping sets over those few groups: per-second sends by region, failover
   durations, the modes present;
2. receives: suppressed and failed copies per region, per-second processing, the regions,
   and the processed copies in a session (the session figures' jobs run only if any);
3. per message id (as a 128-bit hash): the union of sends and processed copies, four
   longs a row (the id's hashes, a time packed as ``time * k + label rank``, the row's
   flags), repartitioned by id (a partition per 2M rows, as counted by jobs 1 and 2)
   and aggregated once after that shuffle, then a small group-by (mode, region, latency
   bucket).

Only small aggregates reach the driver; :func:`~._report.build_report` makes the report.
"""

from __future__ import annotations

__all__ = ["audit", "check_audit_inputs", "spark_aggregates"]

import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, functions as F, types as T
from pyspark.sql.window import Window

from georep.exceptions import ConfigurationError
from georep.ledger.schema import RECEIVES_DIR, SENDS_DIR

from ._report import (
    ACKNOWLEDGED,
    BUCKETS_PER_UNIT,
    DEAD_LETTERED,
    DEFERRED,
    EXPIRED,
    SETTLED_UNPROCESSED,
    UNKNOWN,
    Aggregates,
    _windows,
    build_report,
    ledger_files,
    write_report,
)
from ._session import spark_session

_log = logging.getLogger("georep.audit")

_SPARK_TYPES = {
    "short": T.ShortType(),
    "string": T.StringType(),
    "boolean": T.BooleanType(),
    "timestamp": T.TimestampType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
}


def _struct(columns: str) -> T.StructType:
    """``"name type, name type, ..."`` (types: the keys of ``_SPARK_TYPES``) as a schema."""
    pairs = (column.split() for column in columns.split(","))
    return T.StructType([T.StructField(name, _SPARK_TYPES[kind]) for name, kind in pairs])


_SEND_SCHEMA = _struct(
    "schema_version short, message_id string, mode string, outcome string,"
    " accepted_region string, failover boolean, started_at timestamp, finished_at timestamp"
)
_RECEIVE_SCHEMA = _struct(
    "schema_version short, message_id string, region string, outcome string,"
    " received_at timestamp, settled_at timestamp, session_id string, order_writer string,"
    " order_seq long, order_gap string, order_wait double, finished_at timestamp"
)


def is_uri(location: str | Path) -> bool:
    """True for a ledger on a Hadoop file system (``abfss://``, ``dbfs:/``, ``s3a://``...)."""
    text = str(location)
    return bool(_URI.match(text)) and not _DRIVE.match(text)


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


def _read(spark: SparkSession, directory: str, schema: T.StructType) -> DataFrame | None:
    """The dataset in ``directory``, or None when it does not exist."""
    # Spark skips names starting with "." or "_" (a writer's temporary files) by itself.
    try:
        return (
            spark.read.schema(schema)
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.parquet")
            .parquet(directory)
        )
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            return None
        raise


def _read_ledger(spark: SparkSession, ledger_dir: str | Path) -> tuple[DataFrame, DataFrame]:
    if is_uri(ledger_dir):
        location = str(ledger_dir).rstrip("/")
        sends = _read(spark, f"{location}/{SENDS_DIR}", _SEND_SCHEMA)
        receives = _read(spark, f"{location}/{RECEIVES_DIR}", _RECEIVE_SCHEMA)
        if sends is None and receives is None:
            raise ConfigurationError(
                f"{location} holds no ledger: expected Parquet files in "
                f"{location}/{SENDS_DIR} and {location}/{RECEIVES_DIR}"
            )
    else:
        root = Path(ledger_dir).resolve()
        send_files, receive_files = ledger_files(root)
        sends = _read(spark, str(root / SENDS_DIR), _SEND_SCHEMA) if send_files else None
        receives = (
            _read(spark, str(root / RECEIVES_DIR), _RECEIVE_SCHEMA) if receive_files else None
        )
    return (
        sends if sends is not None else spark.createDataFrame([], _SEND_SCHEMA),
        receives if receives is not None else spark.createDataFrame([], _RECEIVE_SCHEMA),
    )


def _read_meta(spark: SparkSession, location: str) -> tuple[int, list[str]]:
    """``read_meta`` through Spark, for a ledger on a Hadoop file system."""
    try:
        meta = spark.read.schema("dropped_sends long, dropped_receives long").json(
            f"{location.rstrip('/')}/meta/*.json", multiLine=True
        )
        row = meta.agg(
            F.sum(F.coalesce("dropped_sends", F.lit(0)) + F.coalesce("dropped_receives", F.lit(0)))
        ).first()
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            return 0, []
        raise
    return int(row[0] or 0) if row is not None else 0, []


def _second(column: str) -> Column:
    return F.floor(F.unix_micros(F.col(column)) / 1_000_000)


def _bucket(latency_ms: Column) -> Column:
    """The same bucket as ``_reference.latency_buckets``."""
    scaled = F.signum(latency_ms) * F.log1p(F.abs(latency_ms)) * BUCKETS_PER_UNIT
    return F.floor(scaled + 0.5)


def _rank_of(column: Column, labels: Sequence[str]) -> Column:
    """The rank of a (null = UNKNOWN) label in ``labels``, as a long."""
    mapping = F.create_map(*[F.lit(x) for i, label in enumerate(labels) for x in (label, i)])
    return F.element_at(mapping, F.coalesce(column, F.lit(UNKNOWN))).cast("long")


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def _sends_side(sends: DataFrame, result: Aggregates) -> tuple[list[str], int]:
    """Fill the send-side aggregates; return the modes present (sorted) and the rows."""
    duration = (F.unix_micros("finished_at") - F.unix_micros("started_at")) / 1000.0
    failover = F.coalesce(F.col("failover"), F.lit(False))
    frame = sends.select(
        F.col("schema_version").alias("version"),
        F.coalesce("mode", F.lit(UNKNOWN)).alias("mode"),
        F.when(F.col("accepted_region").isNotNull(), _second("started_at")).alias("second"),
        F.col("accepted_region").alias("region"),
        failover.alias("failover"),
        F.when(failover, duration).alias("duration"),
        F.when(failover, _second("started_at")).alias("failover_second"),
    ).withColumn("bucket", _bucket(F.col("duration")))
    # One hash aggregation over the rows (a few groups per second), then the grouping sets
    # over those groups: expanding every row into three sets first costs twice as much.
    groups = frame.groupBy("second", "region", "mode", "failover", "bucket").agg(
        F.count(F.lit(1)).alias("rows"),
        F.max("duration").alias("max_duration"),
        F.min("failover_second").alias("first_second"),
        F.max("failover_second").alias("last_second"),
        F.max("version").alias("version"),
    )
    groups.createOrReplaceTempView("georep_sends")
    rows = _rows(
        frame.sparkSession.sql(
            """
            SELECT second, region, mode, failover, bucket,
                   sum(rows) AS rows, max(max_duration) AS max_duration,
                   min(first_second) AS first_second, max(last_second) AS last_second,
                   max(version) AS version
            FROM georep_sends
            GROUP BY GROUPING SETS ((second, region), (mode), (failover, bucket))
            """
        )
    )
    modes, send_rows = set(), 0
    for row in rows:
        result.max_schema_version = max(result.max_schema_version, row["version"] or 0)
        if row["second"] is not None and row["region"] is not None:
            key = (int(row["second"]), row["region"])
            result.sends_per_second[key] = row["rows"]
        elif row["mode"] is not None:
            modes.add(row["mode"])
            send_rows += row["rows"]
        elif row["failover"]:
            result.failover_sends += row["rows"]
            if row["bucket"] is not None:
                result.failover_duration[int(row["bucket"])] = row["rows"]
                result.failover_duration_max = max(
                    result.failover_duration_max or row["max_duration"], row["max_duration"]
                )
            if row["first_second"] is not None:
                first, last = int(row["first_second"]), int(row["last_second"])
                if result.failover_seconds is not None:
                    first = min(first, result.failover_seconds[0])
                    last = max(last, result.failover_seconds[1])
                result.failover_seconds = (first, last)
    return sorted(modes), send_rows


def _receives_side(receives: DataFrame, result: Aggregates) -> tuple[list[str], int]:
    """Fill the receive-side aggregates and ``session_messages``; return the regions of
    processed copies (sorted) and how many rows the id shuffle takes at most (processed
    copies and those of other outcomes, dead-lettered and deferred among them)."""
    # Outcomes as small ints, 0 processed, 1 suppressed, 2 failed, 3 any other: grouping
    # by the string costs a third more.
    outcome = F.col("outcome")
    code = (
        F.when(outcome == "processed", 0)
        .when(outcome == "suppressed", 1)
        .when(outcome == "failed", 2)
        .otherwise(3)
    )
    rows = _rows(
        receives.select(
            code.alias("outcome"),
            F.coalesce("region", F.lit(UNKNOWN)).alias("region"),
            F.when(code == 0, _second("received_at")).alias("second"),
            "schema_version",
            "session_id",
        )
        .groupBy("outcome", "region", "second")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.max("schema_version").alias("version"),
            F.count("session_id").alias("in_session"),
        )
    )
    regions, copy_rows = set(), 0
    suppressed: dict[str, int] = {}
    failed: dict[str, int] = {}
    for row in rows:
        result.max_schema_version = max(result.max_schema_version, row["version"] or 0)
        region, count = row["region"], row["rows"]
        if row["outcome"] in (0, 3):
            copy_rows += count
        if row["outcome"] == 0:
            regions.add(region)
            result.session_messages += row["in_session"]
            if row["second"] is not None:
                result.processed_per_second[(int(row["second"]), region)] = count
        elif row["outcome"] == 1:
            suppressed[region] = suppressed.get(region, 0) + count
        elif row["outcome"] == 2:
            failed[region] = failed.get(region, 0) + count
    result.suppressed_by_region = suppressed
    result.receive_failed_by_region = failed
    return sorted(regions), copy_rows


def _sessions_side(receives: DataFrame, result: Aggregates) -> None:
    """Sessions, copies handed on out of their session's order (and by how far), gaps and
    the time waited for order, over processed copies (as the reference computes them)."""
    rows = receives.filter((F.col("outcome") == "processed") & F.col("session_id").isNotNull())
    wait_us = F.floor(F.coalesce(F.col("order_wait"), F.lit(0.0)) * F.lit(1e6)).cast("long")
    (totals,) = _rows(
        rows.agg(
            F.countDistinct("session_id").alias("sessions"),
            F.count(F.lit(1)).alias("messages"),
            F.coalesce(F.sum(wait_us), F.lit(0)).alias("wait"),
            F.coalesce(F.max(wait_us), F.lit(0)).alias("wait_max"),
        )
    )
    result.sessions, result.session_messages = totals["sessions"], totals["messages"]
    result.order_wait_us, result.order_wait_max_us = int(totals["wait"]), int(totals["wait_max"])
    gaps = rows.filter(F.col("order_gap").isNotNull()).groupBy("order_gap").count()
    result.order_gaps = {row["order_gap"]: row["count"] for row in _rows(gaps)}
    handled = (
        Window.partitionBy("session_id", F.coalesce(F.col("order_writer"), F.lit("")))
        .orderBy(
            F.coalesce("finished_at", "settled_at", "received_at"),
            F.greatest("order_seq", F.lit(0)),
        )
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    seq = F.greatest(F.col("order_seq"), F.lit(0))
    late = (
        rows.filter(F.col("order_seq").isNotNull())
        .select(seq.alias("seq"), F.max(seq).over(handled).alias("before"))
        .filter(F.col("before") > F.col("seq"))
        .groupBy((F.col("before") - F.col("seq")).alias("distance"))
        .count()
    )
    result.out_of_session_order = {int(r["distance"]): r["count"] for r in _rows(late)}


def _id_hash() -> list[Column]:
    """A message id as two independent 64-bit hashes.

    Grouping 128 bits of longs instead of 36-character strings halves the shuffle. Two ids
    share both hashes with probability about n^2 / 2^129: below 1e-20 for 10^8 ids.
    """
    return [
        F.xxhash64("message_id").alias("id_high"),
        # Another seed for the same function: the hash of 1 seeds the id's hash.
        F.xxhash64(F.lit(1), "message_id").alias("id_low"),
    ]


# The flags of one ledger row, or-ed together per message id.
_SEND, _ACKED, _EXPIRED, _PROCESSED, _DEAD_LETTERED, _DEFERRED = 1, 2, 4, 8, 16, 32


def _bit(condition: Column, bit: int) -> Column:
    """``bit`` where ``condition`` holds, else 0 (also when it is null)."""
    return F.when(condition, F.lit(bit)).otherwise(F.lit(0))


def _has(bit: int) -> Column:
    """Whether ``flags`` has ``bit`` set."""
    return F.col("flags").bitwiseAND(F.lit(bit)) != 0


_ROWS_PER_PARTITION = 2_000_000
"""Rows per partition of the id shuffle: their aggregation map (about 120 MB) fits beside
another task's in the default 1 GiB local-mode heap."""


def _partitions_for(rows: int, floor: int) -> int:
    """Partitions for an id shuffle of ``rows`` rows: one per two million, at least
    ``floor`` (one per core).

    Too few partitions make the per-id aggregation spill and fall back to sorting, many
    times slower (with the 8 of ``spark.sql.shuffle.partitions``, 100M messages made
    aggregation maps of 1.7 GB); each one costs every map task a file, and above 200
    (``spark.shuffle.sort.bypassMergeThreshold``) the map tasks sort their rows.
    """
    return max(floor, -(-rows // _ROWS_PER_PARTITION))


def _per_message(
    sends: DataFrame,
    receives: DataFrame,
    modes: list[str],
    regions: list[str],
    partitions: int,
) -> DataFrame:
    """One row per (mode, region, latency bucket) with the per-id counts summed."""
    mode_span, region_span = max(1, len(modes)), max(1, len(regions))
    acked = F.coalesce(F.col("outcome").isin(*ACKNOWLEDGED), F.lit(False))
    # Shuffled rows are four longs: the id's two hashes, a time (the acknowledged send
    # packed as time * span + mode rank, ties to the smallest mode; the processed copy as
    # time * span + region rank) and the row's flags.
    send_rows = sends.select(
        *_id_hash(),
        F.when(
            acked, F.unix_micros("started_at") * mode_span + _rank_of(F.col("mode"), modes)
        ).alias("time"),
        (F.lit(_SEND) + _bit(acked, _ACKED) + _bit(F.col("outcome") == EXPIRED, _EXPIRED)).alias(
            "flags"
        ),
    )
    processed = F.col("outcome") == "processed"
    copy_rows = receives.where(processed | F.col("outcome").isin(*SETTLED_UNPROCESSED)).select(
        *_id_hash(),
        F.when(
            processed,
            F.unix_micros("received_at") * region_span + _rank_of(F.col("region"), regions),
        ).alias("time"),
        (
            _bit(processed, _PROCESSED)
            + _bit(F.col("outcome") == DEAD_LETTERED, _DEAD_LETTERED)
            + _bit(F.col("outcome") == DEFERRED, _DEFERRED)
        ).alias("flags"),
    )
    # Partitioned by id before grouping: the rows are shuffled as they are and aggregated
    # once after the shuffle (a message's send and copies sit in different files, so a
    # map-side partial aggregation would reduce nothing), while the small group-by below
    # keeps its partial aggregation.
    per_id = (
        send_rows.unionByName(copy_rows)
        .repartition(partitions, "id_high", "id_low")
        .groupBy("id_high", "id_low")
        .agg(
            F.min(F.when(_has(_SEND), F.col("time"))).alias("first_send"),
            F.min(F.when(~_has(_SEND), F.col("time"))).alias("first_copy"),
            F.count_if(_has(_PROCESSED)).alias("copies"),
            F.bit_or("flags").alias("flags"),
        )
    )
    # Integer division: the packed keys exceed a double's 53-bit precision.
    latency_ms = (
        F.expr(f"first_copy div {region_span}") - F.expr(f"first_send div {mode_span}")
    ) / 1000.0
    dead_lettered, deferred, expired = _has(_DEAD_LETTERED), _has(_DEFERRED), _has(_EXPIRED)
    measured = per_id.select(
        _has(_ACKED).alias("sent"),
        _has(_SEND).alias("has_send"),
        F.col("copies"),
        # Settled otherwise by the handler, or dropped as expired: not lost (one reason
        # each, in this order, as the reference audit counts them).
        dead_lettered.alias("dead_lettered"),
        (deferred & ~dead_lettered).alias("deferred"),
        (expired & ~dead_lettered & ~deferred).alias("expired"),
        F.pmod("first_send", F.lit(mode_span)).alias("mode"),
        F.pmod("first_copy", F.lit(region_span)).alias("region"),
        latency_ms.alias("latency"),
    )
    unprocessed = F.col("sent") & (F.col("copies") == 0)
    return measured.groupBy("mode", "region", _bucket(F.col("latency")).alias("bucket")).agg(
        F.count_if("sent").alias("sent"),
        F.count_if(F.col("copies") > 0).alias("processed"),
        F.count_if(
            unprocessed & ~F.col("dead_lettered") & ~F.col("deferred") & ~F.col("expired")
        ).alias("lost"),
        F.count_if(unprocessed & F.col("dead_lettered")).alias("dead_lettered"),
        F.count_if(unprocessed & F.col("deferred")).alias("deferred"),
        F.count_if(unprocessed & F.col("expired")).alias("expired"),
        F.count_if(F.col("copies") >= 2).alias("more_than_once"),
        F.count_if(F.col("has_send") & ~F.col("sent")).alias("send_failed"),
        F.count("latency").alias("measured"),
        F.max("latency").alias("max_latency"),
    )


def check_audit_inputs(
    ledger_dir: str | Path, outage_windows: Iterable[Sequence[Any]] = ()
) -> list[Sequence[Any]]:
    """Check an audit's inputs without Spark; returns the outage windows as a list.

    A local ledger must be a directory whose ``sends/`` and ``receives/`` hold Parquet
    files with a string ``message_id`` (their footers are read, not their rows). A ledger
    given as a URI is checked by Spark itself.

    Raises:
        ConfigurationError: The ledger is missing, empty or holds a file that is not a
            ledger Parquet file, or an outage window is not a (start, end) pair of UTC
            datetimes, ISO 8601 strings with a time zone, or Unix seconds.
    """
    windows = list(outage_windows)
    try:
        _windows(windows)
    except (ValueError, TypeError, OverflowError, OSError) as exc:
        raise ConfigurationError(
            f"outage window {_shown(windows)} is invalid ({exc}): give START,END as "
            "ISO 8601 UTC, e.g. 2026-01-01T10:00:00Z,2026-01-01T10:05:00Z"
        ) from None
    if not is_uri(ledger_dir):
        send_files, receive_files = ledger_files(ledger_dir)
        for path in (*send_files, *receive_files):
            _check_parquet(path)
    return windows


def _shown(windows: list[Sequence[Any]]) -> str:
    return ", ".join(repr(tuple(window)) for window in windows)


def _check_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ConfigurationError(
            f"{path} is not a Parquet file ({str(exc).splitlines()[0]}): a ledger directory "
            "holds only what a ParquetLedger wrote; move the file out"
        ) from None
    index = schema.get_field_index("message_id")
    if index < 0 or not (
        pa.types.is_string(schema.field(index).type)
        or pa.types.is_large_string(schema.field(index).type)
    ):
        raise ConfigurationError(
            f"{path} is not a ledger file (no string message_id column): a ledger directory "
            "holds only what a ParquetLedger wrote; move the file out"
        )


def spark_aggregates(spark: SparkSession, ledger_dir: str | Path) -> Aggregates:
    """Reduce a ledger to :class:`Aggregates` with Spark.

    Raises:
        ConfigurationError: ``ledger_dir`` holds no ledger.
    """
    sends, receives = _read_ledger(spark, ledger_dir)
    result = Aggregates()
    modes, send_rows = _sends_side(sends, result)
    regions, copy_rows = _receives_side(receives, result)
    if result.session_messages:  # else no sessions: skip their three jobs
        _sessions_side(receives, result)
    partitions = _partitions_for(send_rows + copy_rows, spark.sparkContext.defaultParallelism)
    per_message = _rows(_per_message(sends, receives, modes, regions, partitions))
    for row in per_message:
        result.sent += row["sent"]
        result.processed += row["processed"]
        result.lost += row["lost"]
        result.dead_lettered += row["dead_lettered"]
        result.deferred += row["deferred"]
        result.expired += row["expired"]
        result.processed_more_than_once += row["more_than_once"]
        result.send_failed += row["send_failed"]
        if row["measured"]:
            key = (modes[int(row["mode"])], regions[int(row["region"])])
            result.latency.setdefault(key, {})[int(row["bucket"])] = row["measured"]
            result.latency_max[key] = max(
                result.latency_max.get(key, row["max_latency"]), row["max_latency"]
            )
    return result


def audit(
    ledger_dir: str | Path,
    *,
    out_dir: str | Path | None = None,
    master: str | None = "local[*]",
    outage_windows: Iterable[Sequence[Any]] = (),
    plots: bool = True,
) -> dict[str, Any]:
    """Audit a delivery ledger with Spark.

    Args:
        ledger_dir: The ledger directory (``sends/``, ``receives/``, optional ``meta/``):
            a local path, or a URI Spark reads (``abfss://...``, ``dbfs:/...``,
            ``file:///...``) for a ledger on cluster storage.
        out_dir: Where to write ``report.json`` (and the PNGs); ``None`` writes nothing.
        master: Spark master URL; ``None`` leaves it to spark-submit. A session already
            running in the process is reused.
        outage_windows: (start, end) pairs of UTC datetimes (or ISO strings) to shade in
            the timeline, e.g. the outage a demo injected.
        plots: Write ``timeline.png`` and ``latency_cdf.png`` into ``out_dir``.

    Returns:
        The report, exactly as written to ``report.json`` (keys in docs/audit.md).

    Raises:
        ConfigurationError: ``ledger_dir`` holds no ledger, or an outage window is invalid.
    """
    # Everything that can be checked is checked before Spark starts: a bad input is a
    # one-line error, never a Spark traceback after minutes of work.
    outage_windows = check_audit_inputs(ledger_dir, outage_windows)
    spark = spark_session(master)
    report = build_report(
        spark_aggregates(spark, ledger_dir),
        ledger_dir=ledger_dir,
        engine="spark",
        outage_windows=outage_windows,
        meta=_read_meta(spark, str(ledger_dir)) if is_uri(ledger_dir) else None,
    )
    if out_dir is not None:
        write_report(report, out_dir, plots=plots)
    return report
