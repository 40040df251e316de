"""Scale-out end to end on real processes: a cluster of three brokers that are also the three controller voters,
with a topic written by an acks=all producer throughout, grows by two brokers (`LocalCluster.add_broker`), is
rebalanced onto them with a throttle (`tierlog cluster rebalance --execute --throttle --wait`) while a broker
receiving a replica is killed -9 and restarted and the active controller is killed -9, then shrinks back to three
brokers (`tierlog cluster decommission`). Every acknowledged record reads back, every replica's log is the same
batches below the high watermark, no partition keeps a replica on a removed broker and no broker keeps a log
directory of a partition it no longer hosts (docs/reassignment.md#tools)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import ClusterFactory, describe_partitions, partition_states, quorum_leader
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.cli.clients import ClientOptions
from tierlog.cli.cluster import ClusterInfo, write_cluster_info
from tierlog.cli.reassignment import list_reassignments
from tierlog.common import TopicPartition
from tierlog.records.record_batch import complete_batches, read_header
from tierlog.testing.local_cluster import LocalCluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# The `tierlog` console script of the environment running the tests, run as a person runs it.
TIERLOG = Path(sys.executable).with_name("tierlog")
WAIT_S = 60.0
PARTITIONS = 6
VALUE = b"x" * 1000
# Enough data that the throttled copies take seconds: a broker is killed while they run. Meanwhile the producer
# writes far slower than the throttle, or the new replicas could never catch up.
PRELOAD_BYTES = 4 << 20
THROTTLE_BYTES_PER_S = 200_000
OVERRIDES = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "5000",
    "min.insync.replicas": "2",
    # A removed replica's `-delete` directory goes at the next retention check, within the test.
    "log.retention.check.interval.ms": "500",
    "log.segment.delete.delay.ms": "0",
    # Small fetches, so that the throttle bites from the first one (a 1 MiB fetch would copy a partition at once).
    "replica.fetch.max.bytes": "65536",
    "replica.fetch.response.max.bytes": "131072",
}


class AckedProducer:
    """An acks=all producer writing round robin over the topic's partitions from a thread of its own until
    `finish`, remembering every acknowledged record's place."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": int(WAIT_S * 2000),
            }
        )
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="acked-producer", daemon=True)
        self.sent = 0
        self.per_tick = 20  # records every 10 ms at most: ~2 MB/s
        self.tick_s = 0.01

    def slow_down(self) -> None:
        """About 20 KB/s from now on."""
        self.per_tick = 1
        self.tick_s = 0.05

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self.stopping.is_set():
            if time.monotonic() >= next_tick and len(self.producer) < 200:
                for _ in range(self.per_tick):
                    value = b"%d-" % self.sent + VALUE
                    self.producer.produce(self.topic, value, partition=self.sent % PARTITIONS, on_delivery=self._report)
                    self.sent += 1
                next_tick = time.monotonic() + self.tick_s
            # poll returns at the first delivery report, not after its timeout: the clock keeps the pace. Paced by
            # acknowledgements instead, the producer wrote ~120 KB/s, and the leader quota counts what its in-sync
            # followers of throttled replicas fetch (as Kafka's does): a leader of four partitions spent its whole
            # throttle on them and the new replicas it fed never caught up.
            self.producer.poll(max(0.001, next_tick - time.monotonic()))

    def _report(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acked[(message.partition(), message.offset())] = message.value()

    def finish(self) -> None:
        self.stopping.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the producer thread did not stop"
        assert self.producer.flush(WAIT_S) == 0, "records still unacknowledged"


class InstantDeliveries:
    """A producer that always has a delivery report ready, so its poll returns at once (librdkafka's does at the
    first report, whatever the timeout): only the clock can pace the writes."""

    def __init__(self) -> None:
        self.produced = 0

    def __len__(self) -> int:
        return 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.produced += 1

    def poll(self, timeout: float) -> int:
        return 1

    def flush(self, timeout: float) -> int:
        return 0


def test_the_slowed_down_producer_keeps_its_pace_however_fast_deliveries_come() -> None:
    producer = AckedProducer("127.0.0.1:1", "pace")
    fake = InstantDeliveries()
    producer.producer = fake  # type: ignore[assignment]
    producer.slow_down()
    producer.thread.start()
    time.sleep(1.0)
    producer.finish()
    assert fake.produced <= 25, f"{fake.produced} records in a second, not about 20"


def tierlog_client(cluster: LocalCluster) -> ClientOptions:
    return ClientOptions(cluster.bootstrap, 5.0, time.monotonic() + 5.0)


def reassigning(cluster: LocalCluster) -> dict[TopicPartition, Any]:
    try:
        return list_reassignments(None, tierlog_client(cluster))
    except Exception:  # a broker or the controller restarting: asked again
        return {}


def replicas_of(cluster: LocalCluster, topic: str) -> dict[int, list[int]]:
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=WAIT_S)
    return {p.id: list(p.replicas) for p in metadata.topics[topic].partitions.values()}


def in_step(cluster: LocalCluster, topic: str) -> dict[int, int] | None:
    """partition -> high watermark once every partition's leader has all its replicas in the ISR and each replica's
    log ends at the high watermark; None meanwhile."""
    assignment = replicas_of(cluster, topic)
    views = {b: partition_states(cluster, b, topic) or {} for b in cluster.broker_ids if cluster.broker(b).running}
    watermarks = {}
    for partition, replicas in assignment.items():
        states = [views.get(b, {}).get(partition) for b in replicas]
        if any(s is None for s in states):
            return None
        leaders = [s for s in states if s is not None and s["role"] == "leader"]
        if len(leaders) != 1 or sorted(leaders[0]["isr"]) != sorted(replicas):
            return None
        high_watermark = leaders[0]["high_watermark"]
        if any(s is None or s["log_end_offset"] != high_watermark for s in states):
            return None
        watermarks[partition] = high_watermark
    return watermarks


def batches_below(log_dir: Path, high_watermark: int) -> list[bytes]:
    """The partition's batches on disk whose records are all below `high_watermark`, in offset order."""
    batches = []
    for segment in sorted(log_dir.glob("*.log")):
        data = segment.read_bytes()
        for position, size in complete_batches(data):
            header = read_header(data, position)
            if header.base_offset + header.last_offset_delta < high_watermark:
                batches.append(data[position : position + size])
    return batches


def partition_dirs(log_dir: Path, topic: str) -> set[str]:
    return {p.name for p in log_dir.iterdir() if p.is_dir() and p.name.startswith(f"{topic}-")}


def run_tierlog(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TIERLOG), *args], capture_output=True, text=True, timeout=timeout_s)


def test_grow_rebalance_under_crashes_and_shrink_back(cluster_factory: ClusterFactory, kafka: Any) -> None:
    cluster = cluster_factory(OVERRIDES, brokers=3, controllers=3, combined=True)
    topic = kafka.topic_name()
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(WAIT_S)
    wait_until(lambda: in_step(cluster, topic), WAIT_S, "the topic led with every replica in sync")
    producer = AckedProducer(cluster.bootstrap, topic)
    producer.thread.start()
    rebalance: subprocess.Popen[str] | None = None
    crashed: set[int] = set()
    try:
        wait_until(
            lambda: len(producer.acked) * len(VALUE) >= PRELOAD_BYTES, WAIT_S * 2, lambda: f"{PRELOAD_BYTES} B acked"
        )
        producer.slow_down()
        assert (cluster.add_broker(WAIT_S), cluster.add_broker(WAIT_S)) == (4, 5)

        rebalance = subprocess.Popen(
            [
                str(TIERLOG), "cluster", "rebalance", "--execute", "--wait", "--throttle", str(THROTTLE_BYTES_PER_S),
                "--wait-timeout", str(WAIT_S * 2), "-b", cluster.bootstrap,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        moving = wait_until(lambda: reassigning(cluster), WAIT_S, "a reassignment in progress")
        adding = sorted({b for r in moving.values() for b in r.adding})
        assert adding and set(adding) <= {4, 5}, moving

        # A broker receiving a replica crashes mid-copy and comes back.
        cluster.kill(adding[0])
        crashed.add(adding[0])
        time.sleep(1.0)
        cluster.restart(adding[0], WAIT_S)
        assert reassigning(cluster), "the copies finished before the active controller could be killed mid-move"

        # The active controller (a voter that is a broker too) crashes; the quorum elects another.
        active = wait_until(lambda: quorum_leader(cluster, cluster.controller_ids), WAIT_S, "an active controller")[0]
        cluster.kill(active)
        crashed.add(active)
        wait_until(
            lambda: (leader := quorum_leader(cluster, cluster.controller_ids)) and leader[0] != active,
            WAIT_S,
            "another active controller",
        )
        cluster.restart(active, WAIT_S)

        out, err = rebalance.communicate(timeout=WAIT_S * 2)
        assert rebalance.returncode == 0, f"{out}{err}\nreplicas now: {describe_partitions(cluster, topic)}"
        assert out.splitlines()[-1].startswith("Reassignment of ")
        assert not reassigning(cluster)
        spread = replicas_of(cluster, topic)
        assert Counter(b for r in spread.values() for b in r) == {1: 4, 2: 4, 3: 4, 4: 3, 5: 3}
        assert all(n <= 2 for n in Counter(r[0] for r in spread.values()).values())

        # Back to three brokers: the two new ones go.
        write_cluster_info(cluster.base_dir, ClusterInfo.of(cluster))
        for broker in (5, 4):
            gone = run_tierlog(
                "cluster", "decommission", str(broker), "--throttle", str(THROTTLE_BYTES_PER_S * 10),
                "--dir", str(cluster.base_dir), "--wait-timeout", str(WAIT_S * 2), timeout_s=WAIT_S * 3,
            )  # fmt: skip
            assert gone.returncode == 0, gone.stdout + gone.stderr
            assert gone.stdout.splitlines()[-1].startswith(f"broker {broker} decommissioned: stopped")
        status = run_tierlog("cluster", "status", "--json", "--dir", str(cluster.base_dir), timeout_s=WAIT_S)
        assert status.returncode == 0, status.stderr
        assert '"node_id": 4' not in status.stdout and '"node_id": 5' not in status.stdout
    finally:
        if rebalance is not None and rebalance.poll() is None:
            rebalance.kill()
        producer.finish()
    assert not producer.errors, producer.errors[:5]

    final = replicas_of(cluster, topic)
    assert all(set(r) <= {1, 2, 3} for r in final.values()), final
    watermarks = wait_until(lambda: in_step(cluster, topic), WAIT_S, "every replica in step")
    stored = {(r.partition, r.offset): r.value for r in kafka.consume_all(cluster.bootstrap, topic, range(PARTITIONS))}
    lost = [place for place, value in producer.acked.items() if stored.get(place) != value]
    assert not lost, f"{len(lost)} of {len(producer.acked)} acknowledged records lost, e.g. {lost[:3]}"

    # No broker keeps the log of a partition it does not host: a removed replica's directory is deleted. One that
    # a broker missed while it was down is set aside as `-stray` and kept, as Kafka 3.8 does
    # (docs/reassignment.md#removed-replicas): only the crashed brokers may have those.
    def leftovers() -> dict[int, set[str]]:
        extra = {}
        for broker in (1, 2, 3):
            hosted = {f"{topic}-{p}" for p, r in final.items() if broker in r}
            found = partition_dirs(cluster.broker(broker).log_dir, topic)
            kept = {d for d in found if d.endswith("-stray") and broker in crashed}
            if found - kept != hosted:
                extra[broker] = (found - kept) ^ hosted
        return extra

    wait_until(lambda: not leftovers(), WAIT_S, lambda: f"only hosted partitions' directories: {leftovers()}")
    assert not cluster.broker(4).log_dir.exists() and not cluster.broker(5).log_dir.exists()

    # Every replica holds the same batches below the high watermark (read once the brokers have stopped).
    cluster.stop()
    for partition, replicas in final.items():
        logs = {
            b: batches_below(cluster.broker(b).log_dir / f"{topic}-{partition}", watermarks[partition])
            for b in replicas
        }
        first = logs[replicas[0]]
        assert sum(read_header(batch).records_count for batch in first) == watermarks[partition]
        for broker, batches in logs.items():
            assert batches == first, f"{topic}-{partition}: broker {broker}'s log differs below the HW"
