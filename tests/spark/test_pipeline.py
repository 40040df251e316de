"""`tierlog pipeline run|backfill`, run as a user runs them: as processes, each with its own Spark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tierlog.cli.local_cluster import BrokerProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
# A pipeline process starts its own JVM (~20 s here) before it reads anything.
PIPELINE_TIMEOUT_S = 150
BASE = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
BASE_MS = int(BASE.timestamp() * 1000)
STEP_MS = 20_000  # 600 events span 10:00 to 13:20, four hours
EVENTS = 600


def event(i: int) -> bytes:
    return json.dumps({"event_id": i, "user": f"user-{i % 7}", "type": "purchase", "amount_cents": i * 3}).encode()


def produce_events(kafka: Any, bootstrap: str, topic: str, first: int, count: int) -> None:
    records = [
        {"value": event(i), "timestamp": BASE_MS + i * STEP_MS, "partition": i % 2} for i in range(first, first + count)
    ]
    kafka.produce(bootstrap, topic, records)


def pipeline(*args: str) -> list[str]:
    return [sys.executable, "-m", "tierlog.cli.main", "pipeline", *args]


def run_to_completion(command: list[str], log: Path) -> None:
    with log.open("ab") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=_env(), timeout=PIPELINE_TIMEOUT_S)
    assert result.returncode == 0, log.read_text()[-3000:]


def _env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def test_pipeline_run_writes_every_event_once_into_a_table_partitioned_by_date_and_hour(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic, partitions=2)
    produce_events(kafka, shared_broker.bootstrap, topic, 0, EVENTS)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"not json", "timestamp": BASE_MS, "partition": 0}])
    table = tmp_path / "table"
    run_to_completion(pipeline("run", "-b", shared_broker.bootstrap, "-t", topic, "-o", str(table)), tmp_path / "log")

    rows = spark.read.parquet(str(table)).collect()
    parsed = [r for r in rows if r.event_id is not None]
    assert sorted(r.event_id for r in parsed) == list(range(EVENTS))
    assert all(r.amount_cents == r.event_id * 3 and r.user == f"user-{r.event_id % 7}" for r in parsed)
    # Bad input is kept, visible, not dropped.
    (bad,) = [r for r in rows if r.event_id is None]
    assert bad._corrupt_record == "not json"
    # Partition discovery reads the date= directories back as dates.
    assert {(r.date, r.hour) for r in parsed} == {(date(2026, 11, 20), h) for h in (10, 11, 12, 13)}
    assert {p.name for p in table.iterdir() if p.name.startswith("date=")} == {"date=2026-11-20"}
    times = spark.read.parquet(str(table)).selectExpr("event_id", "unix_millis(event_time) AS ms").collect()
    assert all(r.ms == BASE_MS + r.event_id * STEP_MS for r in times if r.event_id is not None)


def _batch_ids(directory: Path) -> set[int]:
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.is_dir() else set()


def test_a_pipeline_killed_mid_batch_and_restarted_from_its_checkpoint_writes_every_event_exactly_once(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic, partitions=2)
    produce_events(kafka, shared_broker.bootstrap, topic, 0, EVENTS)
    table, checkpoint, log = tmp_path / "table", tmp_path / "checkpoint", tmp_path / "log"
    common = ["-b", shared_broker.bootstrap, "-t", topic, "-o", str(table), "-c", str(checkpoint)]
    command = pipeline("run", *common, "--trigger", "1 second", "--max-offsets-per-trigger", "40")
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    try:
        offsets, commits = checkpoint / "offsets", checkpoint / "commits"

        def mid_batch() -> bool:
            # A batch whose offsets are logged but which is not committed yet, after at least two committed
            # ones: its files may be half written, and it must be neither lost nor written twice.
            assert process.poll() is None, log.read_text()[-3000:]
            done = _batch_ids(commits)
            return len(done) >= 2 and bool(_batch_ids(offsets) - done)

        wait_until(mid_batch, PIPELINE_TIMEOUT_S, "the pipeline in the middle of its third or later batch")
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
    assert _batch_ids(offsets) - _batch_ids(commits), "killed with a batch planned but not committed"

    produce_events(kafka, shared_broker.bootstrap, topic, EVENTS, 100)
    run_to_completion(pipeline("run", *common), log)

    rows = spark.read.parquet(str(table)).select("kafka_partition", "kafka_offset", "event_id").collect()
    copies = Counter((r.kafka_partition, r.kafka_offset) for r in rows)
    assert [key for key, n in copies.items() if n > 1] == []
    assert sorted(r.event_id for r in rows) == list(range(EVENTS + 100))


def test_backfill_writes_exactly_the_events_of_its_time_range(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic, partitions=2)
    produce_events(kafka, shared_broker.bootstrap, topic, 0, EVENTS)
    table = tmp_path / "backfill"
    command = pipeline(
        "backfill",
        *("-b", shared_broker.bootstrap, "-t", topic, "-o", str(table)),
        *("--from", "2026-11-20T11:00", "--to", "2026-11-20T12:00:00+00:00"),
    )
    run_to_completion(command, tmp_path / "log")
    in_range = [i for i in range(EVENTS) if 3_600_000 <= i * STEP_MS < 7_200_000]
    rows = spark.read.parquet(str(table)).collect()
    assert sorted(r.event_id for r in rows) == in_range
    assert {r.hour for r in rows} == {11}
