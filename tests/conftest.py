"""The one home of the tests' infrastructure: the fixtures every test gets brokers, clusters, an S3 server and
Kafka clients from, and the markers that sort tests into tiers.

Brokers come from one factory, `LocalBrokers`: `broker_factory(...)` for a single broker, `cluster_factory(...)`
for a `tierlog.testing.local_cluster.LocalCluster` (node 1 broker and controller), both with
`DEFAULT_TEST_OVERRIDES` plus the test's settings (`module_broker_factory`, `module_cluster_factory`,
`shared_broker` live for a module). Every broker is a real process on 127.0.0.1 with free ports and its data
under the test's tmp_path; every wait is bounded, and every broker is stopped (SIGTERM, then SIGKILL) when its
test (or module) ends, pass or fail, with the tail of its log printed, so a failing test shows what it said.

Waits are `tierlog.testing.local_cluster.wait_until`: one bounded poll whose failure names what it waited for.

Tests that start brokers are marked `cluster` by `pytest_collection_modifyitems` (those that start them some
other way carry the marker themselves, and an unmarked test that starts a BrokerProcess fails), tests of a
Spark session `spark`, the simulator's `sim`; `make test-fast` runs the rest (pyproject.toml registers them).

Fixtures are handed out rather than imported, so test files never import `conftest`; what tests import is in
the helper modules next to it (cluster_helpers, tiered_helpers, storage_helpers). Every client helper is bounded
by `CLIENT_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import atexit
import re
import resource
import signal
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import BrokerFactory, ClusterFactory
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.cli.produce import produce_bounded
from tierlog.testing.local_cluster import BrokerProcess, LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server

# How long a broker may take to answer its first ApiVersions, a cluster to have every broker registered, and
# a broker to shut down.
BROKER_READY_TIMEOUT_S = 30.0
CLUSTER_START_TIMEOUT_S = 60.0
BROKER_STOP_TIMEOUT_S = 15.0
# Client-side bound for one admin call, one produce-and-flush, one consume-all.
CLIENT_TIMEOUT_S = 30.0

# 1 MiB segments instead of 1 GiB, so every test that writes more than a MiB exercises segment rolls.
DEFAULT_TEST_OVERRIDES: dict[str, str] = {
    "log.segment.bytes": str(1024 * 1024),
}


def _dotted(key: str) -> str:
    """`log_segment_bytes` -> `log.segment.bytes`: no Kafka setting has an underscore in its name."""
    return key.replace("_", ".")


def _test_settings(overrides: Mapping[str, str] | None, settings: Mapping[str, object]) -> dict[str, str]:
    return {**DEFAULT_TEST_OVERRIDES, **(overrides or {}), **{_dotted(k): str(v) for k, v in settings.items()}}


# Every broker any fixture started and has not stopped yet: the last resort, should pytest exit without
# running fixture teardown (pytest-timeout's thread method, an internal error), is to kill them at exit.
_LIVE_BROKERS: set[BrokerProcess] = set()


@atexit.register
def _kill_leftover_brokers() -> None:
    for broker in list(_LIVE_BROKERS):
        if broker.running:
            broker.kill(signal.SIGKILL)


class LocalBrokers:
    """The one place tests get broker processes from: `broker(...)` starts a single broker, `cluster(...)` a
    LocalCluster (node 1 broker and controller), each with `DEFAULT_TEST_OVERRIDES` plus the test's settings,
    under `base_dir`. Whatever it returns is started and ready; `close` stops all of it (SIGKILL after
    `BROKER_STOP_TIMEOUT_S`) and prints the tail of every broker's log."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.brokers: list[BrokerProcess] = []
        self.clusters: list[LocalCluster] = []

    def broker(self, overrides: Mapping[str, str] | None = None, **settings: object) -> BrokerProcess:
        """A ready broker; `settings` are Kafka settings with underscores (`log_retention_ms=100`)."""
        broker = BrokerProcess(
            self.base_dir / f"broker-{len(self.brokers) + 1}" / "data", overrides=_test_settings(overrides, settings)
        )
        self.brokers.append(broker)
        _LIVE_BROKERS.add(broker)
        broker.start()
        broker.wait_ready(BROKER_READY_TIMEOUT_S)
        return broker

    def cluster(
        self,
        overrides: Mapping[str, str] | None = None,
        brokers: int = 3,
        *,
        controllers: int = 0,
        combined: bool = False,
        **settings: object,
    ) -> LocalCluster:
        """`brokers` started brokers, each registered and listed in every one's Metadata; `controllers` and
        `combined` choose the controller quorum as LocalCluster's do (0: node 1 is the controller)."""
        cluster = LocalCluster(
            self.base_dir / f"cluster-{len(self.clusters) + 1}",
            brokers=brokers,
            overrides=_test_settings(overrides, settings),
            controllers=controllers,
            combined=combined,
        )
        self.clusters.append(cluster)
        _LIVE_BROKERS.update(cluster.broker(node_id) for node_id in cluster.node_ids)
        cluster.start(CLUSTER_START_TIMEOUT_S)
        return cluster

    def close(self) -> None:
        for cluster in self.clusters:
            try:
                cluster.stop(BROKER_STOP_TIMEOUT_S)
            finally:
                self._done_with([cluster.broker(node_id) for node_id in cluster.node_ids])
        for broker in self.brokers:
            try:
                broker.stop(BROKER_STOP_TIMEOUT_S)
            finally:
                self._done_with([broker])

    @staticmethod
    def _done_with(brokers: list[BrokerProcess]) -> None:
        """Forget the brokers that are gone (one still running is left to the exit hook) and print their logs."""
        for broker in brokers:
            if not broker.running:
                _LIVE_BROKERS.discard(broker)
            print(f"\n---- last lines of {broker.log_file} ----\n{broker.log_tail(60)}")


@pytest.fixture
def local_brokers(tmp_path: Path) -> Iterator[LocalBrokers]:
    """The brokers and clusters of one test, stopped when it ends, pass or fail."""
    brokers = LocalBrokers(tmp_path)
    try:
        yield brokers
    finally:
        brokers.close()


@pytest.fixture(scope="module")
def module_local_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokers]:
    """As `local_brokers`, but they live until the module's last test is done."""
    brokers = LocalBrokers(tmp_path_factory.mktemp("module-brokers"))
    try:
        yield brokers
    finally:
        brokers.close()


@pytest.fixture
def broker_factory(local_brokers: LocalBrokers) -> BrokerFactory:
    """`broker_factory(log_retention_check_interval_ms=200)` or `broker_factory({"log.retention.ms": "1"})`:
    a fresh, ready broker with `DEFAULT_TEST_OVERRIDES` plus the given settings, stopped when the test ends."""
    return local_brokers.broker


@pytest.fixture
def cluster_factory(local_brokers: LocalBrokers) -> ClusterFactory:
    """`cluster_factory({"min.insync.replicas": "2"}, brokers=3, controllers=3, combined=True)`: a started
    LocalCluster with `DEFAULT_TEST_OVERRIDES` plus the given settings, stopped when the test ends."""
    return local_brokers.cluster


@pytest.fixture(scope="module")
def module_broker_factory(module_local_brokers: LocalBrokers) -> BrokerFactory:
    """As `broker_factory`, but the brokers live until the module's last test is done."""
    return module_local_brokers.broker


@pytest.fixture(scope="module")
def module_cluster_factory(module_local_brokers: LocalBrokers) -> ClusterFactory:
    """As `cluster_factory`, but the clusters live until the module's last test is done."""
    return module_local_brokers.cluster


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    """A fresh broker for this test alone (to restart, kill or corrupt)."""
    return broker_factory()


@pytest.fixture(scope="module")
def shared_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    """One broker for a module of tests that each work on topics of their own: far cheaper than a broker
    per test. Tests that restart, kill or damage a broker use `broker` instead."""
    return module_broker_factory()


# --- a real S3 server -----------------------------------------------------------------------------------

S3_TEST_BUCKET = "tierlog-test"
S3_START_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """A started LocalS3Server (SeaweedFS `weed mini`) on 127.0.0.1 with the bucket `s3_bucket`, stopped (and its
    process group gone) when the module's last test is done, pass or fail; the tail of its log is printed then.
    Tests share it, so each works under a prefix of its own (`s3_server.rsm_properties(s3_bucket, prefix=...)`),
    and a test that kills or stops it restarts it before it ends (in a `finally`)."""
    server = LocalS3Server(tmp_path_factory.mktemp("s3"))
    try:
        server.start(timeout_s=S3_START_TIMEOUT_S)
        server.create_bucket(S3_TEST_BUCKET)
        yield server
    finally:
        try:
            server.stop()
        finally:
            print(f"\n---- last lines of {server.log_file} ----\n{server.log_tail(40)}")


@pytest.fixture(scope="module")
def s3_bucket(s3_server: LocalS3Server) -> str:
    """The name of the bucket `s3_server` was started with."""
    return S3_TEST_BUCKET


# --- markers: which tier a test belongs to (pyproject.toml registers them) ------------------------------

# A test that asks for one of these (directly or through another fixture) starts broker processes.
_BROKER_FIXTURES = frozenset({"local_brokers", "module_local_brokers", "cli_cluster"})
_SIM_TESTS = Path(__file__).parent / "sim"


def pytest_configure(config: pytest.Config) -> None:
    """The whole suite runs in one process, whose logs, clients and in-process brokers are closed when they are
    collected rather than when their test ends: a machine whose soft limit of open files is 1024 would run out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`cluster` for every test that gets brokers from the fixtures, `spark` for every test of a Spark session,
    `sim` for every test in tests/sim; tests that start brokers or Spark some other way carry the marker
    themselves."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _BROKER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
        if "spark" in fixtures:
            item.add_marker(pytest.mark.spark)
        if item.path.is_relative_to(_SIM_TESTS):
            item.add_marker(pytest.mark.sim)


@pytest.fixture(autouse=True)
def _brokers_only_in_cluster_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test without the `cluster` marker cannot start a BrokerProcess, so the fast tier stays fast: whatever
    starts brokers in this process is marked, by `pytest_collection_modifyitems` or by hand."""
    if request.node.get_closest_marker("cluster") is not None:
        return

    def refuse(broker: BrokerProcess) -> None:
        raise AssertionError(f"{request.node.nodeid} starts broker {broker.node_id} but is not marked `cluster`")

    monkeypatch.setattr(BrokerProcess, "start", refuse)


# --- records --------------------------------------------------------------------------------------------

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Rec:
    """A record as a consumer sees it. `headers` keeps order and duplicates; `timestamp` is the
    CreateTime in ms, `create_time` False when the client saw another timestamp type."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int = -1
    create_time: bool = True

    def content(self) -> tuple[bytes | None, bytes | None, tuple[Header, ...]]:
        return self.key, self.value, self.headers


# A record to produce: {"key": ..., "value": ..., "headers": [...], "timestamp": ms, "partition": n}, every
# field optional.
Spec = Mapping[str, Any]


# --- what the broker stored -----------------------------------------------------------------------------

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def stored_codecs(broker: BrokerProcess, topic: str, partition: int = 0) -> set[str]:
    """The compression codecs of the record batches in a partition's segment files (Kafka's on-disk
    format: baseOffset int64, batchLength int32, ..., attributes int16 at byte 21 whose low 3 bits are the
    codec). Proves which codec a client really used, since librdkafka silently sends batches uncompressed
    when it thinks a broker cannot take its codec."""
    codecs: set[str] = set()
    for segment in sorted((broker.log_dir / f"{topic}-{partition}").glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos + 23 <= len(data):
            (length,) = struct.unpack_from(">i", data, pos + 8)
            (attributes,) = struct.unpack_from(">h", data, pos + 21)
            codecs.add(CODEC_NAMES.get(attributes & 0x7, f"unknown-{attributes & 0x7}"))
            pos += 12 + length
    return codecs


@pytest.fixture
def storage() -> Callable[[BrokerProcess, str, int], set[str]]:
    """`storage(broker, topic, partition)`: the set of codec names of the batches on disk."""
    return stored_codecs


def _fields(record: Spec) -> dict[str, Any]:
    """librdkafka's produce() arguments for a record Spec."""
    fields: dict[str, Any] = {"value": record.get("value"), "key": record.get("key")}
    fields.update(
        {name: record[name] for name in ("headers", "timestamp", "partition") if record.get(name) is not None}
    )
    return fields


# --- confluent-kafka helpers ------------------------------------------------------------------------------


class Kafka:
    """confluent-kafka helpers: topics, produce, consume-all, watermarks; every call bounded."""

    def __init__(self, test_name: str, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.test_name = test_name
        self.timeout_s = timeout_s
        self._topics = 0

    def topic_name(self, hint: str = "") -> str:
        """A topic name unique to this test (Kafka-legal: the test name, a counter and a random suffix)."""
        self._topics += 1
        base = re.sub(r"[^a-zA-Z0-9._-]", "-", f"{self.test_name}{hint}")[:150]
        return f"{base}-{self._topics}-{uuid.uuid4().hex[:6]}"

    def admin(self, bootstrap: str) -> AdminClient:
        return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(self.timeout_s * 1000)})

    def new_topic(
        self, bootstrap: str, partitions: int = 1, config: Mapping[str, str] | None = None, *, hint: str = ""
    ) -> str:
        """A topic of this test's own (`topic_name(hint)`), created as `create_topic` creates it; its name."""
        name = self.topic_name(hint)
        self.create_topic(bootstrap, name, partitions, config)
        return name

    def create_topic(
        self, bootstrap: str, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create `name` and wait until metadata shows a leader for every partition."""
        admin = self.admin(bootstrap)
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))],
            request_timeout=self.timeout_s,
        )
        futures[name].result(timeout=self.timeout_s)

        def ready() -> bool:
            meta = admin.list_topics(topic=name, timeout=self.timeout_s).topics.get(name)
            return (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            )

        wait_until(ready, self.timeout_s, f"a leader for every partition of {name}")

    def topic_exists(self, bootstrap: str, name: str) -> bool:
        """Whether the broker knows `name`, asked with a Metadata request for that topic alone that does not
        ask for auto-creation (an admin client's would: librdkafka's producer-type handles do by default)."""
        consumer = self.consumer(bootstrap, allow_auto_create_topics=False)
        try:
            meta = consumer.list_topics(topic=name, timeout=self.timeout_s).topics.get(name)
        finally:
            consumer.close()
        if meta is None or meta.error is not None:
            assert meta is None or meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, meta.error
            return False
        return True

    def producer(self, bootstrap: str, **config: object) -> Producer:
        settings: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": int(self.timeout_s * 1000),
        }
        settings.update({_dotted(k): v for k, v in config.items()})
        return Producer(settings)

    def produce(self, bootstrap: str, topic: str, records: Sequence[Spec], **config: object) -> list[tuple[int, int]]:
        """Produce `records` in order; return each one's acknowledged (partition, offset). Any delivery
        error fails. `config` is librdkafka settings, `compression_type="zstd"` or `{"compression.type": ...}`."""
        producer = self.producer(bootstrap, **config)
        acked: list[tuple[int, int] | None] = [None] * len(records)
        errors: list[str] = []

        def on_delivery(index: int) -> Callable[[KafkaError | None, Any], None]:
            def report(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    errors.append(f"record {index}: {err}")
                else:
                    acked[index] = (msg.partition(), msg.offset())

            return report

        for index, record in enumerate(records):
            produce_bounded(producer, self.timeout_s, topic=topic, on_delivery=on_delivery(index), **_fields(record))
        remaining = producer.flush(self.timeout_s)
        assert remaining == 0, f"{remaining} records still undelivered after {self.timeout_s}s"
        assert not errors, f"delivery failed: {errors[:5]}"
        return [a for a in acked if a is not None]

    def delivery_errors(
        self, bootstrap: str, topic: str, records: Sequence[Spec], **config: object
    ) -> list[str | None]:
        """Produce each of `records` in a batch of its own (a refused batch fails every record in it); return each
        one's delivery error name, None for a delivered record. For tests of what the broker refuses."""
        producer = self.producer(bootstrap, linger_ms=0, **config)
        errors: list[str | None] = []
        for record in records:
            producer.produce(topic, on_delivery=lambda err, _msg: errors.append(err and err.name()), **_fields(record))
            assert producer.flush(self.timeout_s) == 0, f"a record still undelivered after {self.timeout_s}s"
        return errors

    def consumer(self, bootstrap: str, **config: object) -> Consumer:
        """A consumer that never joins a group: librdkafka requires a group.id, but we only assign()."""
        settings: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "socket.timeout.ms": int(self.timeout_s * 1000),
        }
        settings.update({_dotted(k): v for k, v in config.items()})
        return Consumer(settings)

    def watermarks(self, bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
        """(log start offset, high watermark), asked of the broker (ListOffsets -2 and -1)."""
        consumer = self.consumer(bootstrap)
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.timeout_s, cached=False
            )
            return int(low), int(high)
        finally:
            consumer.close()

    def delete_records_before(self, bootstrap: str, topic: str, offset: int, partition: int = 0) -> None:
        """DeleteRecords of everything before `offset`, then wait until the log start offset is `offset`."""
        admin = self.admin(bootstrap)
        deleted = admin.delete_records([TopicPartition(topic, partition, offset)], request_timeout=self.timeout_s)
        for future in deleted.values():
            future.result(self.timeout_s)
        wait_until(
            lambda: self.watermarks(bootstrap, topic, partition)[0] == offset, self.timeout_s, f"log start {offset}"
        )

    def consume_all(
        self, bootstrap: str, topic: str, partitions: Sequence[int] = (0,), start_offset: int = OFFSET_BEGINNING
    ) -> list[Rec]:
        """Every record from `start_offset` up to each partition's high watermark at the time of the call,
        sorted by (partition, offset). Fails on any consumer error or if an end is not reached in time."""
        consumer = self.consumer(bootstrap)
        try:
            ranges = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=self.timeout_s, cached=False)
                for p in partitions
            }
            ends = {p: high for p, (_, high) in ranges.items()}
            pending = {p for p, (low, high) in ranges.items() if high > max(low, start_offset)}
            consumer.assign([TopicPartition(topic, p, start_offset) for p in pending])
            records: list[Rec] = []
            deadline = time.monotonic() + self.timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"consumed {len(records)} records of {topic}; partitions {sorted(pending)} did not reach "
                        f"their high watermarks {ends} within {self.timeout_s}s"
                    )
                for msg in consumer.consume(num_messages=10_000, timeout=0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if msg.offset() >= ends[msg.partition()]:
                                pending.discard(msg.partition())
                            continue
                        raise KafkaException(err)
                    if msg.partition() not in pending:
                        continue
                    ts_type, ts = msg.timestamp()
                    records.append(
                        Rec(
                            partition=msg.partition(),
                            offset=msg.offset(),
                            key=msg.key(),
                            value=msg.value(),
                            headers=tuple(msg.headers() or ()),
                            timestamp=ts,
                            create_time=ts_type == 1,  # TIMESTAMP_CREATE_TIME
                        )
                    )
                    if msg.offset() + 1 >= ends[msg.partition()]:
                        pending.discard(msg.partition())
            records.sort(key=lambda r: (r.partition, r.offset))
            return records
        finally:
            consumer.close()


@pytest.fixture
def kafka(request: pytest.FixtureRequest) -> Kafka:
    return Kafka(request.node.name)


# --- one adapter per client library: the same produce/consume contract for each ---------------------------


class ClientAdapter:
    """Produce `Spec`s to one partition and read `Rec`s back with one client library.

    `produce` returns the acknowledged offsets in order; `consume` returns `count` records from `start`
    (no consumer group: assign and seek). `compression` is Kafka's name (none, gzip, snappy, lz4, zstd).
    """

    name = ""

    def __init__(self, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Spec], compression: str = "none", partition: int = 0
    ) -> list[int]:
        raise NotImplementedError

    def consume(self, bootstrap: str, topic: str, count: int, partition: int = 0, start: int = 0) -> list[Rec]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class ConfluentAdapter(ClientAdapter):
    name = "confluent-kafka"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Spec], compression: str = "none", partition: int = 0
    ) -> list[int]:
        specs = [{**r, "partition": partition} for r in records]
        acked = Kafka("adapter", self.timeout_s).produce(bootstrap, topic, specs, compression_type=compression)
        return [offset for _, offset in acked]

    def consume(self, bootstrap: str, topic: str, count: int, partition: int = 0, start: int = 0) -> list[Rec]:
        records = Kafka("adapter", self.timeout_s).consume_all(bootstrap, topic, (partition,), start_offset=start)
        return records[:count]


def _assign_only(timeout_s: float) -> dict[str, Any]:
    """kafka-python's and aiokafka's consumer settings (they share them) for a consumer that assigns and seeks:
    no group, no commits, and an error rather than a reset when an offset is out of range."""
    return {
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "none",
        "request_timeout_ms": int(timeout_s * 1000),
    }


def _python_client_rec(m: Any) -> Rec:
    """A Rec from a kafka-python or aiokafka ConsumerRecord (the same fields; timestamp_type 0 is CreateTime)."""
    return Rec(
        partition=m.partition,
        offset=m.offset,
        key=m.key,
        value=m.value,
        headers=tuple((k, v) for k, v in m.headers or ()),
        timestamp=m.timestamp,
        create_time=m.timestamp_type == 0,
    )


class KafkaPythonAdapter(ClientAdapter):
    name = "kafka-python"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Spec], compression: str = "none", partition: int = 0
    ) -> list[int]:
        from kafka import KafkaProducer

        # kafka-python 3 turns idempotence on by default when the broker looks new enough; these tests are
        # about the data path, and test_kafka_python.py checks the default producer on its own.
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=False,
            acks="all",
            linger_ms=5,
            compression_type=None if compression == "none" else compression,
            request_timeout_ms=int(self.timeout_s * 1000),
        )
        try:
            futures = [
                producer.send(
                    topic,
                    value=r.get("value"),
                    key=r.get("key"),
                    headers=list(r.get("headers") or []),
                    partition=partition,
                    timestamp_ms=r.get("timestamp"),
                )
                for r in records
            ]
            producer.flush(timeout=self.timeout_s)
            return [f.get(timeout=self.timeout_s).offset for f in futures]
        finally:
            producer.close(timeout=self.timeout_s)

    def consume(self, bootstrap: str, topic: str, count: int, partition: int = 0, start: int = 0) -> list[Rec]:
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTopicPartition

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, **_assign_only(self.timeout_s))
        try:
            tp = KTopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, start)
            records: list[Rec] = []
            deadline = time.monotonic() + self.timeout_s
            while len(records) < count:
                assert time.monotonic() < deadline, f"kafka-python read {len(records)} of {count} records in time"
                for batch in consumer.poll(timeout_ms=200).values():
                    records.extend(map(_python_client_rec, batch))
            return records[:count]
        finally:
            consumer.close()


class AiokafkaAdapter(ClientAdapter):
    name = "aiokafka"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Spec], compression: str = "none", partition: int = 0
    ) -> list[int]:
        from aiokafka import AIOKafkaProducer

        async def run() -> list[int]:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                linger_ms=5,
                compression_type=None if compression == "none" else compression,
                request_timeout_ms=int(self.timeout_s * 1000),
            )
            await producer.start()
            try:
                futures = [
                    await producer.send(
                        topic,
                        value=r.get("value"),
                        key=r.get("key"),
                        partition=partition,
                        timestamp_ms=r.get("timestamp"),
                        headers=list(r.get("headers") or []),
                    )
                    for r in records
                ]
                return [(await f).offset for f in futures]
            finally:
                await producer.stop()

        return asyncio.run(asyncio.wait_for(run(), self.timeout_s))

    def consume(self, bootstrap: str, topic: str, count: int, partition: int = 0, start: int = 0) -> list[Rec]:
        from aiokafka import AIOKafkaConsumer
        from aiokafka import TopicPartition as ATopicPartition

        async def run() -> list[Rec]:
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **_assign_only(self.timeout_s))
            await consumer.start()
            try:
                tp = ATopicPartition(topic, partition)
                consumer.assign([tp])
                consumer.seek(tp, start)
                records: list[Rec] = []
                while len(records) < count:
                    for batch in (await consumer.getmany(timeout_ms=200)).values():
                        records.extend(map(_python_client_rec, batch))
                return records[:count]
            finally:
                await consumer.stop()

        return asyncio.run(asyncio.wait_for(run(), self.timeout_s))


class KcatAdapter(ClientAdapter):
    """kcat (librdkafka's command-line client). Producing: one line per record, `key<TAB>value`, with -Z
    turning an empty key or value into NULL; headers (-H) are the same for every record of a run and
    CreateTime is the time of sending. Consuming: a format with key and value lengths, so any bytes read
    back exactly."""

    name = "kcat"
    # offset, timestamp, key length, value length, headers; a newline; then the key and value bytes.
    CONSUME_FORMAT = "%o %T %K %S %h\\n%k%s"

    def _run(self, args: list[str], stdin: bytes = b"") -> bytes:
        done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, timeout=self.timeout_s, check=False)
        assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}: {done.stderr.decode()}"
        return done.stdout

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Spec], compression: str = "none", partition: int = 0
    ) -> list[int]:
        headers = {tuple(r.get("headers") or ()) for r in records}
        assert len(headers) <= 1, "kcat sets the same headers on every record of a run"
        lines = []
        for r in records:
            key, value = r.get("key") or b"", r.get("value") or b""
            assert b"\t" not in key + value and b"\n" not in key + value, "kcat input is tab/line delimited"
            lines.append(key + b"\t" + value + b"\n")
        args = ["-P", "-b", bootstrap, "-t", topic, "-p", str(partition), "-K", "\t", "-Z"]
        args += ["-X", f"compression.codec={compression}", "-X", "acks=all"]
        for name, value in next(iter(headers), ()):
            args += ["-H", f"{name}={value.decode()}"]
        high_before = Kafka("kcat", self.timeout_s).watermarks(bootstrap, topic, partition)[1]
        self._run(args, b"".join(lines))
        high_after = Kafka("kcat", self.timeout_s).watermarks(bootstrap, topic, partition)[1]
        assert high_after - high_before == len(records), "kcat did not produce every record"
        return list(range(high_before, high_after))

    def consume(self, bootstrap: str, topic: str, count: int, partition: int = 0, start: int = 0) -> list[Rec]:
        args = ["-C", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o", str(start), "-c", str(count)]
        args += ["-e", "-q", "-f", self.CONSUME_FORMAT]
        out = self._run(args)
        records: list[Rec] = []
        pos = 0
        while pos < len(out):
            end = out.index(b"\n", pos)
            offset, ts, klen, vlen, header_text = out[pos:end].decode().split(" ", 4)
            pos = end + 1
            key = value = None
            if int(klen) >= 0:
                key, pos = out[pos : pos + int(klen)], pos + int(klen)
            if int(vlen) >= 0:
                value, pos = out[pos : pos + int(vlen)], pos + int(vlen)
            headers = tuple(
                (name, v.encode()) for name, _, v in (h.partition("=") for h in header_text.split(",") if h)
            )
            records.append(Rec(partition, int(offset), key, value, headers, int(ts)))
        return records


CLIENT_ADAPTERS: dict[str, type[ClientAdapter]] = {
    a.name: a for a in (ConfluentAdapter, KafkaPythonAdapter, AiokafkaAdapter, KcatAdapter)
}


@pytest.fixture
def clients() -> dict[str, ClientAdapter]:
    """`clients["kafka-python"].produce(...)`: one adapter per client library."""
    return {name: adapter() for name, adapter in CLIENT_ADAPTERS.items()}
