"""The transactional sink end to end on a real broker: a consume-transform-produce stream (read_committed source,
`tierlog.sink.transactional=true` sink) killed with SIGKILL while a micro-batch's transactions are open, twice,
then restarted from its checkpoint, leaves every input record exactly once in the output topic for read_committed
readers, while read_uncommitted readers see the rows of the transaction the kill left (aborted on restart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from tierlog.client.security import ClientSecurity
from tierlog.spark.exactly_once import query_prefix
from tierlog.spark.txn_client import TxnClient
from tierlog.testing.local_cluster import BrokerProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("exactly_once_job.py")
JOB_TIMEOUT_S = 240
RECORDS = 1000  # 25 micro-batches of 40: many chances to find one with open transactions, twice
INPUT_PARTITIONS = 2
OUTPUT_PARTITIONS = 3


def _env() -> dict[str, str]:
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def _consumer(bootstrap: str, isolation: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )


def _ends(consumer: Consumer, topic: str) -> list[int]:
    """Each partition's end as `consumer`'s isolation level sees it (high watermark, or last stable offset)."""
    return [
        consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=10, cached=False)[1]
        for p in range(OUTPUT_PARTITIONS)
    ]


def read_all(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Every value of `topic` up to the ends `isolation` reads to."""
    consumer = _consumer(bootstrap, isolation)
    try:
        ends = _ends(consumer, topic)
        consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(OUTPUT_PARTITIONS)])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while any(consumer.position([KafkaTopicPartition(topic, p)])[0].offset < ends[p] for p in range(len(ends))):
            assert time.monotonic() < deadline, f"{topic} not read to {ends} in 60 s"
            for message in consumer.consume(500, timeout=0.5):
                assert message.error() is None, message.error()
                values.append(message.value())
        return values
    finally:
        consumer.close()


def produce_input(bootstrap: str, topic: str) -> None:
    """RECORDS committed records, plus a transaction of records that is aborted: a read_committed source never
    passes those on."""
    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(RECORDS):
        plain.produce(topic, key=str(i).encode(), value=str(i).encode(), partition=i % INPUT_PARTITIONS)
    assert plain.flush(30) == 0
    aborted = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"aborted-{uuid.uuid4().hex[:6]}"})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    for i in range(20):
        aborted.produce(topic, value=f"aborted-{i}".encode(), partition=i % INPUT_PARTITIONS)
    aborted.flush(30)
    aborted.abort_transaction(30)


def committed_batches(checkpoint: Path) -> list[Path]:
    commits = checkpoint / "commits"
    return list(commits.glob("[0-9]*")) if commits.exists() else []


def kill_mid_batch(
    bootstrap: str, output_topic: str, command: list[str], checkpoint: Path, log: Path, after_batches: int
) -> None:
    """Run the stream until, with `after_batches` batches committed, a micro-batch's transactions hold written
    rows (the output's high watermark is past its last stable offset), and SIGKILL it there, JVM and all."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*command, "--every-second"], stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
        )
    uncommitted, committed = _consumer(bootstrap, "read_uncommitted"), _consumer(bootstrap, "read_committed")
    try:

        def transaction_open() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            if len(committed_batches(checkpoint)) < after_batches:
                return False
            return _ends(uncommitted, output_topic) != _ends(committed, output_topic)

        wait_until(transaction_open, JOB_TIMEOUT_S, f"a micro-batch with open transactions after {after_batches}")
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        uncommitted.close()
        committed.close()


@pytest.mark.spark  # its Spark runs in the job's own processes, not the `spark` fixture
def test_a_stream_killed_mid_batch_and_restarted_writes_every_input_exactly_once_for_read_committed_readers(
    shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    bootstrap = shared_broker.bootstrap
    input_topic = kafka.new_topic(bootstrap, partitions=INPUT_PARTITIONS, hint="in")
    output_topic = kafka.new_topic(bootstrap, partitions=OUTPUT_PARTITIONS, hint="out")
    produce_input(bootstrap, input_topic)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "job.log"
    command = [sys.executable, str(JOB), bootstrap, input_topic, output_topic, str(checkpoint)]

    # Killed twice, each time while a micro-batch's transactions hold written rows, the second time after the
    # first restart has committed batches of its own.
    kill_mid_batch(bootstrap, output_topic, command, checkpoint, log, after_batches=2)
    kill_mid_batch(
        bootstrap, output_topic, command, checkpoint, log, after_batches=len(committed_batches(checkpoint)) + 2
    )
    with log.open("ab") as out:
        result = subprocess.run(
            [*command, "--available-now"], stdout=out, stderr=subprocess.STDOUT, env=_env(), timeout=JOB_TIMEOUT_S
        )
    assert result.returncode == 0, log.read_text()[-3000:]

    seen = Counter(read_all(bootstrap, output_topic, "read_committed"))
    assert [value for value, n in seen.items() if n > 1] == []
    assert sorted(seen) == sorted(f"out-{i}".encode() for i in range(RECORDS))
    # The kill left rows in an open transaction, which the restart aborted and wrote again: a read_uncommitted
    # reader sees both copies.
    everything = read_all(bootstrap, output_topic, "read_uncommitted")
    assert len(everything) > RECORDS
    assert set(everything) == set(seen)
    # Nothing of the query's is left open on the brokers.
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    with TxnClient(bootstrap, ClientSecurity()) as client:
        mine = query_prefix("tierlog-spark", query_id)
        assert [t for t in client.list_transactions(["Ongoing"]) if t.transactional_id.startswith(mine)] == []
