"""The transactional sink's options, checked on the driver in one line each (no Spark, no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from tierlog.spark.sink import DEFAULT_TRANSACTION_TIMEOUT_MS, parse_sink_options
from tierlog.spark.source import TierlogDataSource

SCHEMA = StructType([StructField("value", BinaryType())])


def options(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "topic": "out",
        "tierlog.sink.transactional": "true",
        "checkpointLocation": str(tmp_path),
        **extra,
    }


def test_transactional_options_are_parsed_with_their_defaults(tmp_path: Path) -> None:
    parsed = parse_sink_options(options(tmp_path), SCHEMA)
    assert parsed.transactional and parsed.checkpoint_location == str(tmp_path)
    assert parsed.transactional_id_prefix == "tierlog-spark"
    assert parsed.transaction_timeout_ms == DEFAULT_TRANSACTION_TIMEOUT_MS
    custom = parse_sink_options(
        options(tmp_path, **{"tierlog.sink.transactional.id.prefix": "etl", "kafka.transaction.timeout.ms": "60000"}),
        SCHEMA,
    )
    assert (custom.transactional_id_prefix, custom.transaction_timeout_ms) == ("etl", 60000)
    assert (
        parse_sink_options(options(tmp_path, **{"kafka.compression.type": "zstd"}), SCHEMA).compression.name == "ZSTD"
    )
    assert not parse_sink_options({"kafka.bootstrap.servers": "b:9092", "topic": "out"}, SCHEMA).transactional


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tierlog.sink.transactional": "yes"}, "'tierlog.sink.transactional' must be true or false"),
        ({"kafka.transactional.id": "mine"}, "'kafka.transactional.id' is not supported"),
        ({"kafka.acks": "1"}, "'kafka.acks' must be all"),
        ({"kafka.transaction.timeout.ms": "soon"}, "'kafka.transaction.timeout.ms' must be a positive integer"),
        ({"checkpointLocation": "s3a://bucket/checkpoint"}, "must be a file system path the driver can write"),
        ({"checkpointLocation": "checkpoints/etl"}, "needs an absolute checkpointLocation"),
        ({"kafka.compression.type": "brotli"}, "'kafka.compression.type' must be none, gzip, snappy, lz4 or zstd"),
    ],
)
def test_wrong_transactional_options_fail_in_one_line(tmp_path: Path, extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        parse_sink_options(options(tmp_path, **extra), SCHEMA)
    assert "\n" not in str(raised.value)


def test_the_transactional_sink_needs_the_querys_checkpoint_location_option(tmp_path: Path) -> None:
    given = options(tmp_path)
    del given["checkpointLocation"]
    with pytest.raises(ValueError, match="needs the query's checkpointLocation option"):
        parse_sink_options(given, SCHEMA)


def test_a_batch_write_refuses_the_transactional_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is for streaming queries"):
        TierlogDataSource(options(tmp_path)).writer(SCHEMA, overwrite=False)
