"""`tierlog pipeline run|backfill`, run as a user runs them: as processes, each with its own Spark."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import ClusterFactory
from pyspark.sql import SparkSession
from tiered_helpers import create_topic, start_tiered_broker, tiered_topic_configs, wait_tiered

from tierlog.spark.pipeline import checkpoint_position
from tierlog.testing.local_cluster import BrokerProcess, free_port, wait_until
from tierlog.testing.local_s3 import LocalS3Server

ROOT = Path(__file__).resolve().parents[2]
# A pipeline process starts its own JVM (~20 s here) before it reads anything.
PIPELINE_TIMEOUT_S = 150
# What is checked before Spark starts is answered in seconds, Spark not started at all.
PREFLIGHT_TIMEOUT_S = 60
# After Ctrl-C: the running micro-batch is stopped, then Spark.
STOP_TIMEOUT_S = 60
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
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
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
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
    produce_events(kafka, shared_broker.bootstrap, topic, 0, EVENTS)
    table, checkpoint, log = tmp_path / "table", tmp_path / "checkpoint", tmp_path / "log"
    common = ["-b", shared_broker.bootstrap, "-t", topic, "-o", str(table), "-c", str(checkpoint)]
    # SIGKILL leaves no chance to delete Spark's temporary log: this one goes with tmp_path.
    killed = ["--trigger", "1 second", "--max-offsets-per-trigger", "40", "--spark-log", str(tmp_path / "spark.log")]
    command = pipeline("run", *common, *killed)
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
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
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


# -- what a person sees: one-line errors, progress, Ctrl-C, listening sockets ----------------------------------


def run_pipeline(*args: str, env: dict[str, str] | None = None, timeout_s: float = PIPELINE_TIMEOUT_S) -> Any:
    return subprocess.run(pipeline(*args), capture_output=True, text=True, env=env or _env(), timeout=timeout_s)


def assert_one_line_error(result: Any, first_line: str) -> None:
    """Exit code 1, stderr a short `Error: ...` starting with `first_line`, and none of Spark's noise."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr[-3000:]
    assert 1 <= len(lines) <= 3, result.stderr[-3000:]
    assert lines[0].startswith(first_line), lines[0]
    for noise in ("Traceback", "Py4J", "py4j", "java.", "WARN", "ERROR"):
        assert noise not in result.stderr + result.stdout, (noise, result.stderr[-3000:])


@pytest.mark.parametrize("command", ["run", "backfill"])
def test_pipeline_on_a_missing_topic_fails_in_one_line_without_starting_spark(
    command: str, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.topic_name("missing")
    spark_log = tmp_path / "spark.log"  # created when Spark starts
    args = [
        command,
        "-b",
        shared_broker.bootstrap,
        "-t",
        topic,
        "-o",
        str(tmp_path / "t"),
        "--spark-log",
        str(spark_log),
    ]
    if command == "backfill":
        args += ["--from", "2026-11-20T10:00", "--to", "2026-11-20T11:00"]
    result = run_pipeline(*args, timeout_s=PREFLIGHT_TIMEOUT_S)
    assert_one_line_error(result, f"Error: topic '{topic}' does not exist")
    assert not spark_log.exists()
    assert not kafka.topic_exists(shared_broker.bootstrap, topic), "the check created the topic"


def _without_aws_credentials() -> dict[str, str]:
    # botocore would otherwise find credentials of the machine's own (variables, files, instance metadata).
    env = {key: value for key, value in _env().items() if not key.startswith("AWS_")}
    return env | {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


@pytest.mark.parametrize(
    "case", ["no credentials", "wrong secret", "no such bucket", "unreachable endpoint", "broker config"]
)
def test_pipeline_with_a_wrong_remote_tier_fails_in_one_line_naming_the_cause_without_starting_spark(
    case: str, shared_broker: BrokerProcess, s3_server: LocalS3Server, s3_bucket: str, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=1)
    brokers = s3_server.rsm_properties(s3_bucket, prefix=tmp_path.name)
    good = {key.removeprefix("rsm.config."): value for key, value in brokers.items()}
    url = good["url"]
    wrong_secret = good | {"aws.secret.access.key": "not-the-secret"}
    free = f"http://127.0.0.1:{free_port()}"
    settings, cause = {
        "no credentials": (
            {k: v for k, v in good.items() if not k.startswith("aws.")},
            f"Error: remote tier {url}: no credentials: give rsm.config.aws.access.key.id",
        ),
        "wrong secret": (wrong_secret, f"Error: remote tier {url}: {s3_server.endpoint_url} denied access (403"),
        "no such bucket": (
            good | {"url": "s3://no-such-bucket/x"},
            f"Error: remote tier s3://no-such-bucket/x: bucket 'no-such-bucket' does not exist at "
            f"{s3_server.endpoint_url}",
        ),
        "unreachable endpoint": (
            good | {"s3.endpoint.url": free},
            f"Error: remote tier {url}: cannot reach {free} (connection refused)",
        ),
        "broker config": (wrong_secret, f"Error: remote tier {url}: {s3_server.endpoint_url} denied access (403"),
    }[case]
    if case == "broker config":
        # A broker's whole server.properties: the other settings are ignored, rsm.config.* taken.
        properties = tmp_path / "server.properties"
        lines = ["node.id=1", "log.dirs=/var/lib/tierlog", "remote.log.storage.system.enable=true"]
        properties.write_text("\n".join(lines + [f"rsm.config.{k}={v}" for k, v in settings.items()]) + "\n")
        remote = ["--broker-config", str(properties)]
    else:
        remote = [arg for key, value in settings.items() for arg in ("--remote", f"{key}={value}")]
    spark_log = tmp_path / "spark.log"
    common = ["-b", shared_broker.bootstrap, "-t", topic, "-o", str(tmp_path / "t"), "--spark-log", str(spark_log)]
    result = run_pipeline("run", *common, *remote, env=_without_aws_credentials(), timeout_s=PREFLIGHT_TIMEOUT_S)
    assert_one_line_error(result, cause)
    assert not spark_log.exists()


def test_pipeline_that_fails_inside_spark_tells_the_cause_in_one_line_and_keeps_spark_s_log(
    cluster_factory: ClusterFactory, kafka: Any, tmp_path: Path
) -> None:
    """Remote settings the quick check cannot fault (a file:// directory is always there) but which hold none of
    the segments the brokers' metadata lists: the driver's plan fails inside Spark, in a Python worker."""
    remote = tmp_path / "remote"
    remote.mkdir()
    wrong = tmp_path / "not-the-remote-tier"
    wrong.mkdir()
    cluster = start_tiered_broker(cluster_factory, {"url": remote.as_uri()})
    topic = kafka.topic_name()
    # No retention.ms: the events' fixed timestamps are older than the default 7 days.
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(**{"retention.ms": "-1"}), replication_factor=1)
    records = [{"value": event(i), "timestamp": BASE_MS + i * STEP_MS, "partition": 0} for i in range(EVENTS)]
    kafka.produce(cluster.bootstrap, topic, records, batch_size=2048)
    wait_tiered(cluster, 1, topic, EVENTS // 4, settled=True)
    table = tmp_path / "table"
    result = run_pipeline(
        "run", "-b", cluster.bootstrap, "-t", topic, "-o", str(table), "--remote", f"url={wrong.as_uri()}"
    )
    assert_one_line_error(result, f"Error: remote tier {wrong.as_uri()}: no object ")
    log = re.search(r"\(Spark's log: (\S+)\)$", result.stderr.strip().splitlines()[0])
    assert log is not None, result.stderr
    try:
        # Spark's noise went to the log: the JVM's stack trace and the Python worker's traceback.
        text = Path(log.group(1)).read_text()
        assert "at org.apache.spark" in text and "RemoteTierError" in text, text[-3000:]
    finally:
        Path(log.group(1)).unlink(missing_ok=True)


_BATCH_LINE = re.compile(r"batch (\d+): ([\d,]+) rows, (.+)")


def batches(stdout: str) -> list[tuple[int, int, dict[str, tuple[int, int]]]]:
    """(batch id, rows, {partition: (from, to)}) of each `batch N: R rows, t-0 a->b, ...` line."""
    out = []
    for line in stdout.splitlines():
        match = _BATCH_LINE.fullmatch(line)
        if match is not None:
            ranges = {}
            for part in match.group(3).split(", "):
                name, span = part.rsplit(" ", 1)
                start, end = span.split("->")
                ranges[name] = (int(start), int(end))
            out.append((int(match.group(1)), int(match.group(2).replace(",", "")), ranges))
    return out


def test_pipeline_run_reports_its_start_each_batch_s_offsets_and_where_a_rerun_resumes(
    shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
    produce_events(kafka, shared_broker.bootstrap, topic, 0, EVENTS)  # 300 per partition
    table, checkpoint = tmp_path / "table", tmp_path / "table" / "_checkpoint"
    common = ["-b", shared_broker.bootstrap, "-t", topic, "-o", str(table), "--max-offsets-per-trigger", "200"]
    p0, p1 = f"{topic}-0", f"{topic}-1"

    first = run_pipeline("run", *common, "--spark-ui")
    assert first.returncode == 0 and first.stderr == "", first.stderr[-3000:]
    lines = first.stdout.splitlines()
    assert lines[0] == f"streaming {topic} into {table} (every offset read through the brokers)"
    assert lines[1] == f"starting from the earliest offsets {p0} 0, {p1} 0; the topic ends at {p0} 300, {p1} 300"
    assert re.fullmatch(r"Spark UI: http://127\.0\.0\.1:\d+", lines[2]), lines[2]
    done = batches(first.stdout)
    # Each batch goes on where the last one ended, up to the end of the topic, one row per offset.
    position = {p0: 0, p1: 0}
    for _, rows, ranges in done:
        assert 0 < rows <= 200 and rows == sum(end - start for start, end in ranges.values()), ranges
        for name, (start, end) in ranges.items():
            assert start == position[name], (name, start, position)
            position[name] = end
    assert position == {p0: 300, p1: 300}
    last = done[-1][0]
    assert (
        lines[-1]
        == f"600 rows in {len(done)} batches written to {table}; checkpoint {checkpoint} at {p0} 300, {p1} 300"
    )

    produce_events(kafka, shared_broker.bootstrap, topic, EVENTS, 100)
    second = run_pipeline("run", *common)
    assert second.returncode == 0 and second.stderr == "", second.stderr[-3000:]
    lines = second.stdout.splitlines()
    assert lines[1] == (
        f"resuming from checkpoint {checkpoint} after batch {last}, at {p0} 300, {p1} 300; "
        f"the topic ends at {p0} 350, {p1} 350"
    )
    assert [(batch, ranges) for batch, _, ranges in batches(second.stdout)] == [
        (last + 1, {p0: (300, 350), p1: (300, 350)})
    ]


def _process_group(pgid: int) -> set[int]:
    members = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                members.add(int(entry))
    return members


def listeners(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, program) of every TCP socket the processes listen on, as `ss -ltnp` shows them."""
    shown = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True, timeout=30).stdout
    out = []
    for line in shown.splitlines():
        owner = re.search(r'users:\(\("([^"]+)",pid=(\d+),', line)
        if owner is not None and int(owner.group(2)) in pids:
            address, port = line.split()[3].rsplit(":", 1)
            out.append((address, int(port), owner.group(1)))
    return out


def answers_http(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
            connection.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return connection.recv(5) == b"HTTP/"
    except OSError:
        return False


def test_ctrl_c_stops_a_pipeline_quietly_with_exit_code_130_and_spark_listens_on_loopback_only(
    shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
    produce_events(kafka, shared_broker.bootstrap, topic, 0, EVENTS)
    table, checkpoint = tmp_path / "table", tmp_path / "table" / "_checkpoint"
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    command = pipeline(
        "run", "-b", shared_broker.bootstrap, "-t", topic, "-o", str(table), "--trigger", "1 second",
        "--max-offsets-per-trigger", "40",
    )  # fmt: skip
    with out.open("wb") as stdout, err.open("wb") as stderr:
        # Its own process group, as a shell's foreground job: Ctrl-C signals every process in it, Spark's too.
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=_env(), start_new_session=True)
    try:

        def batch_reported() -> bool:
            assert process.poll() is None, err.read_text()[-3000:]
            return bool(batches(out.read_text()))

        wait_until(batch_reported, PIPELINE_TIMEOUT_S, "the pipeline's first batch line")
        group = _process_group(process.pid)
        sockets = listeners(group)
        assert any(program == "java" for _, _, program in sockets), sockets
        assert {address for address, _, _ in sockets} <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, sockets
        # No web UI: none of Spark's sockets answers HTTP.
        assert not [port for _, port, program in sockets if program == "java" and answers_http(port)], sockets

        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(STOP_TIMEOUT_S) == 130, err.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    position = checkpoint_position(str(checkpoint))
    assert position is not None and position[1] is not None
    at = ", ".join(f"{t}-{p} {o}" for (t, p), o in sorted(position[1].items()))
    assert err.read_text() == f"stopped; the next run resumes from the checkpoint {checkpoint} at {at}\n"
    assert not [line for line in out.read_text().splitlines() if "Traceback" in line or "Error" in line]
    # Spark went with it: nothing of the job is left running.
    wait_until(lambda: not _process_group(process.pid), STOP_TIMEOUT_S, "Spark's processes to exit")
