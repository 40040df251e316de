"""`tierlog pipeline run --master spark://...` on a Spark standalone cluster (tierlog.testing.local_spark): a
master and two workers on 127.0.0.1, each its own process, whose Python has tierlog's dependencies but not
tierlog, so the job only runs if it ships tierlog to the executors itself. The topic is tiered to S3 and the
executors read the remote tier straight from the bucket."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import ClusterFactory
from pyspark.sql import SparkSession
from tiered_helpers import create_topic, start_tiered_broker, tiered_topic_configs, wait_tiered

from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server
from tierlog.testing.local_spark import LocalSparkCluster

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
# The driver's JVM, the executors' and their Python workers start, then a dozen micro-batches.
PIPELINE_TIMEOUT_S = 150
PARTITIONS = 4
EVENTS = 4000
PER_BATCH = 800  # five micro-batches
BASE_MS = 1_795_600_800_000  # 2026-11-25T10:00:00Z


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[LocalSparkCluster]:
    with LocalSparkCluster(tmp_path / "spark-cluster", workers=2, cores=1, memory="1g") as cluster:
        yield cluster


def python_without_tierlog(directory: Path) -> Path:
    """An executable running this venv's Python with its packages (tierlog's dependencies) on the path but not
    the .pth file of the editable install: `import tierlog` fails there unless the job ships it."""
    wrapper = directory / "python-without-tierlog"
    site_packages = sysconfig.get_path("purelib")
    wrapper.write_text(
        f'#!/bin/sh\nexec env PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site_packages}" {sys.executable} -S "$@"\n'
    )
    wrapper.chmod(0o755)
    # As the workers run it: no PYTHONPATH in their environment (LocalSparkCluster leaves it out), and not in
    # this checkout.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    probe = subprocess.run(
        [str(wrapper), "-c", "import pyspark, numba, pyarrow; import tierlog"],
        capture_output=True,
        env=environment,
        cwd=directory,
    )
    assert probe.returncode != 0 and b"No module named 'tierlog'" in probe.stderr, probe.stderr
    return wrapper


def tiered_topic(cluster_factory: ClusterFactory, rsm_config: dict[str, str], kafka: Any) -> tuple[LocalCluster, str]:
    """A broker tiering to S3 and a topic of EVENTS JSON events most of which are in the remote tier only."""
    cluster = start_tiered_broker(cluster_factory, rsm_config)
    topic = kafka.topic_name()
    # No retention.ms: the events' fixed timestamps are older than the default 7 days.
    configs = tiered_topic_configs(**{"retention.ms": "-1"})
    create_topic(cluster.bootstrap, topic, configs, partitions=PARTITIONS, replication_factor=1)
    produce_events(kafka, cluster.bootstrap, topic)
    for partition in range(PARTITIONS):
        wait_tiered(cluster, 1, topic, EVENTS // PARTITIONS // 2, partition, settled=True)
    return cluster, topic


def remote_fetches_served(cluster: LocalCluster) -> float:
    """The broker's count of reads it served from the remote tier (Kafka's RemoteFetchRequestsPerSec)."""
    with urllib.request.urlopen(f"http://{cluster.http_address(1)}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = [line.split()[-1] for line in text.splitlines() if line.startswith("tierlog_remote_fetch_requests_total")]
    assert samples, "the broker exports tierlog_remote_fetch_requests_total"
    return sum(float(sample) for sample in samples)


def produce_events(kafka: Any, bootstrap: str, topic: str) -> None:
    records = [
        {
            "value": json.dumps({"event_id": i, "user": f"user-{i % 7}", "type": "view", "amount_cents": i}).encode(),
            "timestamp": BASE_MS + i * 1000,
            "partition": i % PARTITIONS,
        }
        for i in range(EVENTS)
    ]
    kafka.produce(bootstrap, topic, records, batch_size=2048)


def _batch_ids(directory: Path) -> set[int]:
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.is_dir() else set()


def _rest(ui: str, path: str) -> Any:
    with urllib.request.urlopen(f"{ui}/api/v1/{path}", timeout=5) as response:
        return json.load(response)


def busy_executors(ui: str) -> set[str]:
    """The ids of the executors running a task now, from the driver's REST API."""
    try:
        (application,) = _rest(ui, "applications")
        executors = _rest(ui, f"applications/{application['id']}/executors")
    except (OSError, ValueError):
        return set()  # the UI is not up yet, or the application not listed yet
    return {e["id"] for e in executors if e["id"] != "driver" and e["isActive"] and e["activeTasks"] > 0}


def worker_of(cluster: LocalSparkCluster, executor_id: str) -> int | None:
    """The worker running executor `executor_id` (its JVM's command line names it)."""
    for index, worker in enumerate(cluster.workers):
        for command in worker.processes().values():
            if re.search(rf"--executor-id {executor_id}\b", command):
                return index
    return None


def lost_tasks(event_log_dir: Path) -> list[dict[str, Any]]:
    """The task ends of the application's event log whose reason is ExecutorLostFailure."""
    # One file, or with rolling event logs a directory of them per application.
    lines = [line for log in event_log_dir.rglob("*") if log.is_file() for line in log.read_text().splitlines()]
    ends = [json.loads(line) for line in lines if '"SparkListenerTaskEnd"' in line]
    return [end for end in ends if end["Task End Reason"]["Reason"] == "ExecutorLostFailure"]


# Spark's start on a cluster (the driver, two executors, their Python workers compiling the converter) takes
# longer than a local session's.
@pytest.mark.timeout(300)
def test_pipeline_on_a_spark_cluster_writes_every_record_exactly_once_though_a_worker_dies_mid_job(
    spark: SparkSession,
    spark_cluster: LocalSparkCluster,
    cluster_factory: ClusterFactory,
    s3_server: LocalS3Server,
    s3_bucket: str,
    kafka: Any,
    tmp_path: Path,
) -> None:
    brokers = s3_server.rsm_properties(s3_bucket, prefix=tmp_path.name)
    rsm_config = {key.removeprefix("rsm.config."): value for key, value in brokers.items()}
    cluster, topic = tiered_topic(cluster_factory, rsm_config, kafka)
    remote_fetches_before = remote_fetches_served(cluster)
    # The table on a path every worker reaches (one host here; a shared filesystem or S3 on a real cluster).
    table, checkpoint = tmp_path / "table", tmp_path / "table" / "_checkpoint"
    events, out, err = tmp_path / "events", tmp_path / "stdout", tmp_path / "stderr"
    events.mkdir()
    command = [
        *(sys.executable, "-m", "tierlog.cli.main", "pipeline", "run", "--master", spark_cluster.master_url),
        *("-b", cluster.bootstrap, "-t", topic, "-o", str(table)),
        *(arg for key, value in rsm_config.items() for arg in ("--remote", f"{key}={value}")),
        *("--max-offsets-per-trigger", str(PER_BATCH), "--spark-ui", "--spark-log", str(tmp_path / "spark.log")),
        # Spark's event log keeps every task's end and its reason: the proof that the kill cost running tasks.
        *("--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={events.as_uri()}"),
        *("--conf", "spark.eventLog.compress=false"),
    ]
    environment = os.environ | {
        "PYTHONPATH": str(ROOT),  # the driver's tierlog: this worktree's
        "PYSPARK_PYTHON": str(python_without_tierlog(tmp_path)),
    }
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=environment, start_new_session=True)
    try:

        def ui() -> str | None:
            assert process.poll() is None, err.read_text()[-3000:]
            found = re.search(r"^Spark UI: (\S+)$", out.read_text(), re.MULTILINE)
            return found.group(1) if found else None

        driver_ui = wait_until(ui, PIPELINE_TIMEOUT_S, "the pipeline's Spark UI line")

        def worker_running_a_task_mid_job() -> int | None:
            # Once a batch is committed and the next one planned, a worker whose executor runs one of its tasks.
            assert process.poll() is None, err.read_text()[-3000:]
            if not _batch_ids(checkpoint / "commits") or not _batch_ids(checkpoint / "offsets") - _batch_ids(
                checkpoint / "commits"
            ):
                return None
            for executor in busy_executors(driver_ui):
                index = worker_of(spark_cluster, executor)
                if index is not None:
                    return index + 1  # 0 would read as "not yet"
            return None

        victim = (
            wait_until(worker_running_a_task_mid_job, PIPELINE_TIMEOUT_S, "a task running mid-job", interval_s=0.2) - 1
        )
        executors = spark_cluster.executors(victim)
        killed = spark_cluster.kill_worker(victim)
        assert executors and set(executors) <= set(killed), (executors, killed)
        committed_at_kill = max(_batch_ids(checkpoint / "commits"))
        assert process.wait(PIPELINE_TIMEOUT_S) == 0, err.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)

    assert out.read_text().splitlines()[0].endswith(f"(the remote tier read straight from {rsm_config['url']})")
    # The executors read the remote tier from the bucket: the broker served none of it.
    assert remote_fetches_served(cluster) == remote_fetches_before
    # The job went on past the kill on the surviving worker, to the end of the topic.
    assert max(_batch_ids(checkpoint / "commits")) > committed_at_kill
    assert spark_cluster.alive_workers() == 1
    # The survivor's executor ran the shipped tierlog, its compiled kernels cached in its own directory.
    survivor = spark_cluster.work_dir(1 - victim)
    assert list(survivor.glob("app-*/*/tierlog.zip")), sorted(survivor.rglob("*"))[:20]
    assert list(survivor.glob("app-*/*/tierlog-cache/numba/*/*.nbi")), sorted(survivor.rglob("*"))[:20]
    lost = lost_tasks(events)
    assert lost, "no task was running on the killed worker's executor"
    rows = spark.read.parquet(str(table)).select("kafka_partition", "kafka_offset", "event_id").collect()
    copies = Counter((r.kafka_partition, r.kafka_offset) for r in rows)
    assert len(rows) == EVENTS and len(copies) == EVENTS, (len(rows), len(copies))
    assert sorted(r.event_id for r in rows) == list(range(EVENTS))
    assert out.read_text().splitlines()[-1].startswith(f"{EVENTS:,} rows in ")
