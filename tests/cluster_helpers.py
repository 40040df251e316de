"""What the tests of real brokers share besides conftest's fixtures (the brokers and clusters themselves come from
its `broker_factory` and `cluster_factory`): one request sent the way a Kafka client sends it, each broker's own
view of its replicas (GET /v1/partitions on its tierlog.http.listener), a partition as Metadata describes it, the
leader both agree on, and a producer thread that keeps sending while a test kills brokers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, PartitionMetadata

from tierlog.client.connection import KafkaConnection
from tierlog.client.probes import quorum_leadership
from tierlog.testing.local_cluster import BrokerProcess, LocalCluster, wait_until

# What conftest's `broker_factory(overrides, **settings)` and `cluster_factory(overrides, brokers=3)` are.
BrokerFactory = Callable[..., BrokerProcess]
ClusterFactory = Callable[..., LocalCluster]

HTTP_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 30.0


def send_request(address: str, request: Any, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
    """The broker's response to `request` (a kio request object) sent to `address` (host:port) over a connection
    of its own, as a Kafka client sends it."""
    host, port = address.rsplit(":", 1)

    async def exchange() -> Any:
        async with asyncio.timeout(timeout_s):
            connection = await KafkaConnection.open(host, int(port), client_id="tierlog-tests", timeout_s=timeout_s)
            try:
                return await connection.send(request, timeout_s=timeout_s)
            finally:
                await connection.close()

    return asyncio.run(exchange())


def http_get(address: str, path: str, timeout_s: float = HTTP_TIMEOUT_S) -> bytes:
    """The body of GET `path` from a broker's HTTP listener at `address` (OSError if it does not answer)."""
    with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout_s) as response:
        body: bytes = response.read()
        return body


def partition_states(cluster: LocalCluster, node_id: int, topic: str) -> dict[int, dict[str, Any]] | None:
    """partition -> broker `node_id`'s own state of its replica of `topic`-partition, as its /v1/partitions
    reports it (role, leader, epochs, ISR, HW, LEO, remote replicas); None if the broker does not answer."""
    try:
        document = json.loads(http_get(cluster.http_address(node_id), "/v1/partitions"))
    except (OSError, ValueError):
        return None
    return {p["partition"]: p for p in document["partitions"] if p["topic"] == topic}


def replica_state(cluster: LocalCluster, node_id: int, topic: str, partition: int = 0) -> dict[str, Any] | None:
    """Broker `node_id`'s own state of its replica of `topic`-`partition`; None if it does not answer or hosts
    no such replica."""
    return (partition_states(cluster, node_id, topic) or {}).get(partition)


def metadata_partition(bootstrap: str, topic: str, partition: int, timeout_s: float) -> PartitionMetadata | None:
    """`topic`-`partition` as a Metadata answer from `bootstrap` describes it (a fresh client each time, so
    nothing is cached); None if no broker answers in time or the partition is unknown."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return None
    if metadata is None or metadata.error is not None:
        return None
    return metadata.partitions.get(partition)


def confirmed_leader(cluster: LocalCluster, topic: str, partition: int) -> tuple[int, int] | None:
    """(leader, leader epoch) once Metadata names a leader that itself reports being leader with every broker
    of the cluster in its ISR; None meanwhile (a broker just killed may be asked first: callers poll)."""
    named = metadata_partition(cluster.bootstrap, topic, partition, timeout_s=5)
    leader = -1 if named is None else named.leader
    if leader not in cluster.node_ids or not cluster.broker(leader).running:
        return None
    state = (partition_states(cluster, leader, topic) or {}).get(partition)
    if state is None or state["role"] != "leader" or sorted(state["isr"]) != sorted(cluster.node_ids):
        return None
    return leader, int(state["leader_epoch"])


def wait_confirmed_leader(
    cluster: LocalCluster, topic: str, partition: int, timeout_s: float, context: str = ""
) -> tuple[int, int]:
    """`confirmed_leader`, waited for; the failure names `context` and every broker's view of `topic`."""
    return wait_until(
        lambda: confirmed_leader(cluster, topic, partition),
        timeout_s,
        lambda: f"{context}a leader of {topic}-{partition} with the full ISR ({describe_partitions(cluster, topic)})",
    )


def create_topic_with_leaders(cluster: LocalCluster, topic: NewTopic, partitions: int, timeout_s: float) -> None:
    """Create `topic` and wait until each of its `partitions` has a confirmed leader with the full ISR."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([topic], request_timeout=15)[topic.topic].result(timeout=30)
    for partition in range(partitions):
        wait_confirmed_leader(cluster, topic.topic, partition, timeout_s)


def partition_views(cluster: LocalCluster, topic: str) -> dict[int, dict[int, dict[str, Any]] | None]:
    """node -> its own view of `topic`'s partitions; None for a broker that is down or does not answer."""
    return {n: partition_states(cluster, n, topic) if cluster.broker(n).running else None for n in cluster.node_ids}


def describe_partitions(cluster: LocalCluster, topic: str) -> str:
    """One line of every broker's role, leader, epoch, ISR, HW and LEO per partition, for wait messages."""
    rows = []
    for node, partitions in partition_views(cluster, topic).items():
        if partitions is None:
            rows.append(f"broker {node}: no answer")
            continue
        for p, s in sorted(partitions.items()):
            rows.append(
                f"broker {node} p{p}: {s['role']} leader={s['leader']} epoch={s['leader_epoch']} isr={s['isr']} "
                f"hw={s['high_watermark']} leo={s['log_end_offset']}"
            )
    return "; ".join(rows)


class BackgroundProducer(threading.Thread):
    """A librdkafka producer sending from a thread of its own while a test kills brokers: `produce_burst()` (the
    subclass's) every `tick_s` while fewer than `max_queued` records wait, until `finish()`, which flushes and
    re-raises whatever went wrong in the thread (a test cannot see a thread's exception otherwise)."""

    def __init__(self, name: str, config: dict[str, object], *, tick_s: float, max_queued: int, flush_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.producer = Producer(config)
        self.tick_s = tick_s
        self.max_queued = max_queued
        self.flush_s = flush_s
        self.stopping = threading.Event()
        self.unflushed = 0
        self.error: BaseException | None = None

    def produce_burst(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                if len(self.producer) < self.max_queued:
                    self.produce_burst()
                self.producer.poll(self.tick_s)
            self.unflushed = self.producer.flush(self.flush_s)
        except BaseException as e:
            self.error = e

    def finish(self) -> None:
        """Stop producing, wait for the flush, and raise what the thread raised."""
        self.stopping.set()
        self.join(self.flush_s + 10)
        assert not self.is_alive(), f"the producer did not stop and flush within {self.flush_s + 10}s"
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Stop the thread if `finish` did not, without raising: for a test's `finally`."""
        if self.is_alive():
            self.stopping.set()
            self.join(self.flush_s + 10)


def quorum_leader(cluster: LocalCluster, voters: Iterable[int]) -> tuple[int, int] | None:
    """(leader id, epoch) as DescribeQuorum answers it, from the first of `voters` that leads the controller
    quorum (only the leader answers it)."""
    for voter in voters:
        found = quorum_leadership("127.0.0.1", cluster.controller_ports[voter], timeout_s=2.0)
        if found is not None:
            return found
    return None


def read_partition_from_start(
    bootstrap: str, topic: str, isolation: str, timeout_s: float = REQUEST_TIMEOUT_S
) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of `topic`'s partition 0 from offset 0 to its end (the last stable
    offset for read_committed), read by confluent-kafka with `isolation` ("read_committed"/"read_uncommitted")."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        records: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            assert time.monotonic() < deadline, f"{isolation} read of {topic} did not reach its end"
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return records
                raise KafkaException(error)
            records.append((message.offset() or 0, message.key(), message.value()))
    finally:
        consumer.close()
