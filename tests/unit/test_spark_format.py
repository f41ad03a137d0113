"""The georep Spark format without Spark running: options, MessageIds, staging, schema."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from georep import ConfigurationError
from georep.adapters.spark import SOURCE_SCHEMA, sink_message_id
from georep.adapters.spark._sink import MessageIds, RowLayout, sink_settings
from georep.adapters.spark._source import source_settings
from georep.adapters.spark._staging import ARROW_SCHEMA, Staging, read_staged, staging_path

CONNECTION = {
    "primaryConnectionString": "Endpoint=sb://a/;SharedAccessKeyName=k;SharedAccessKey=SECRET",
    "secondaryConnectionString": "Endpoint=sb://b/;SharedAccessKeyName=k;SharedAccessKey=SECRET",
}
SOURCE = {
    **CONNECTION,
    "queueName": "orders",
    "seenSetUrl": "redis://:hunter2@127.0.0.1:6379/0",
    "stagingLocation": "/tmp/staging",
}


def _lower(options: dict[str, str]) -> dict[str, str]:
    """As Spark hands options to a data source: keys lower-cased."""
    return {key.lower(): value for key, value in options.items()}


def test_a_message_id_column_is_sent_as_it_is() -> None:
    layout = RowLayout.of(["message_id", "body"])
    ids = MessageIds(layout, "scope", 3)
    assert ids.of(("order-7", "x")) == "order-7"
    with pytest.raises(ConfigurationError, match="null 'message_id'"):
        ids.of((None, "x"))


def test_a_key_column_derives_the_foreach_batch_ids() -> None:
    layout = RowLayout.of(["key", "body"], key_column="key")
    ids = MessageIds(layout, "q", 3)
    assert ids.of(("k", "x")) == sink_message_id("q", 3, "k")
    with pytest.raises(ConfigurationError, match="appears twice"):
        ids.of(("k", "y"))


def test_rows_without_identity_get_ids_from_their_content_and_rank() -> None:
    layout = RowLayout.of(["body", "n", "props"])
    first, replay = MessageIds(layout, "q", 1), MessageIds(layout, "q", 1)
    rows = [("a", 1, {"y": "2", "x": "1"}), ("a", 1, {"x": "1", "y": "2"}), ("b", 1, None)]
    made = [first.of(row) for row in rows]
    assert len(set(made)) == 3, "identical rows are told apart by their rank"
    assert [replay.of(row) for row in rows] == made, "a replay derives the same ids"
    assert MessageIds(layout, "q", 2).of(rows[0]) != made[0], "another batch, other ids"


def test_a_missing_body_column_is_named() -> None:
    with pytest.raises(ConfigurationError, match="no column 'payload'"):
        RowLayout.of(["key", "body"], body_column="payload")


def test_sink_options_are_checked_with_their_names() -> None:
    settings = sink_settings(_lower({**CONNECTION, "queueName": "q", "mode": "Active"}))
    assert (settings.mode, settings.entity.queue_name, settings.batch_size) == ("active", "q", 100)
    assert "SECRET" not in repr(settings)
    with pytest.raises(ConfigurationError, match="no option 'maxmessagespertrigger'"):
        sink_settings(_lower({**CONNECTION, "queueName": "q", "maxMessagesPerTrigger": "5"}))
    with pytest.raises(ConfigurationError, match="exactly one entity"):
        sink_settings(_lower({**CONNECTION, "queueName": "q", "topicName": "t"}))
    with pytest.raises(ConfigurationError, match="one connection string is missing"):
        sink_settings(_lower({"primaryConnectionString": "x", "queueName": "q"}))
    with pytest.raises(ConfigurationError, match="'attemptTimeoutSeconds' must be a positive"):
        sink_settings(_lower({**CONNECTION, "queueName": "q", "attemptTimeoutSeconds": "nan"}))


def test_source_options_are_checked_with_their_names() -> None:
    settings = source_settings(_lower({**SOURCE, "maxMessagesPerBatch": "50"}))
    assert (settings.max_messages, settings.seen_group) == (50, "georep-spark")
    assert "SECRET" not in repr(settings) and "hunter2" not in repr(settings)
    missing = {k: v for k, v in SOURCE.items() if k != "stagingLocation"}
    with pytest.raises(ConfigurationError, match="needs option 'stagingLocation'"):
        source_settings(_lower(missing))
    with pytest.raises(ConfigurationError, match="local or mounted path, not a s3a"):
        source_settings(_lower({**SOURCE, "stagingLocation": "s3a://bucket/x"}))
    with pytest.raises(ConfigurationError, match="add subscriptionName"):
        topic = {k: v for k, v in SOURCE.items() if k != "queueName"}
        source_settings(_lower({**topic, "topicName": "t"}))
    with pytest.raises(ConfigurationError, match="'maxMessagesPerBatch' must be at least 1"):
        source_settings(_lower({**SOURCE, "maxMessagesPerBatch": "0"}))


def test_namespaces_take_a_credential_named_by_module_and_callable() -> None:
    options = {
        "primaryNamespace": "a.servicebus.windows.net",
        "secondaryNamespace": "b.servicebus.windows.net",
        "credential": "tests.unit.test_spark_format:_no_such_factory",
        "queueName": "q",
    }
    settings = sink_settings(_lower(options))
    with pytest.raises(ConfigurationError, match="cannot find"):
        settings.connection.targets()


def test_the_staged_schema_is_the_one_spark_expects() -> None:
    from pyspark.sql import types
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark's DDL parser needs a running JVM: the DDL's few types, by hand.
    ddl_types = {
        "string": types.StringType(),
        "binary": types.BinaryType(),
        "timestamp": types.TimestampType(),
        "map<string,string>": types.MapType(types.StringType(), types.StringType()),
    }
    fields = [column.split(" ", 1) for column in SOURCE_SCHEMA.split(", ")]
    schema = types.StructType([types.StructField(name, ddl_types[kind]) for name, kind in fields])
    assert to_arrow_schema(schema, timezone="UTC").equals(ARROW_SCHEMA)


def test_a_staged_batch_reads_back_identically(tmp_path: Path) -> None:
    staging = Staging(staging_path(str(tmp_path / "staging")))
    assert staging.open() == 0
    rows = [
        {"message_id": "m1", "body": b"x", "application_properties": [("k", "v")]},
        {"message_id": "m2", "body": b"y", "application_properties": None},
    ]
    staging.write(1, pa.Table.from_pylist(rows, schema=ARROW_SCHEMA))
    (tmp_path / "staging" / ".batch-000000000002.parquet.tmp").write_bytes(b"cut short")
    assert Staging(staging.root).open() == 0, "a write cut short is dropped on open"
    assert staging.batches() == [1] and staging.message_ids(1) == ["m1", "m2"]
    read = pa.Table.from_batches(list(read_staged(str(staging.path(1)), 1)))
    assert read.schema.equals(ARROW_SCHEMA)
    assert read.column("message_id").to_pylist() == ["m1", "m2"]
    staging.set_committed(1)
    staging.drop_through(1)
    assert (staging.committed(), staging.batches()) == (1, [])
    with pytest.raises(FileNotFoundError, match="staged batch 1 is missing"):
        list(read_staged(str(staging.path(1)), 1))
