"""The stories of docs/replication.md told again on a real three-broker cluster (LocalCluster processes).

Node 1 is broker and controller; every test places its replicas on nodes 2 and 3 (2 the preferred leader), so
killing or pausing a replica never takes the controller with it. What the stories assert is read where an
operator would read it: the brokers' /v1/partitions and /v1/trace endpoints, /metrics, the files in the data
directories (replication-offset-checkpoint, the .log segments) and ordinary Kafka clients.

Every wait is bounded and names what it waited for; every broker is stopped when its test ends, pass or fail,
and the tail of each broker's log is printed then, which is where a failure's reason usually is.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from cluster_helpers import HTTP_TIMEOUT_S, ClusterFactory, http_get, metadata_partition, replica_state
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.records.codec import decode_batches
from tierlog.testing.local_cluster import LocalCluster, wait_until

LEADER, FOLLOWER = 2, 3
CLUSTER_START_S = 60.0
CLIENT_TIMEOUT_S = 20.0
# A killed broker is fenced after broker.session.timeout.ms; an election and the metadata that spreads it
# take well under a few more seconds.
SESSION_TIMEOUT_MS = 2500
FAILOVER_S = 20.0
CONVERGE_S = 20.0

# Fast fencing of crashed brokers, and HW checkpoints every 100 ms so a test can read the HW on disk without
# waiting the default 5 s.
BASE_OVERRIDES = {
    "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "broker.heartbeat.interval.ms": "300",
    "replica.high.watermark.checkpoint.interval.ms": "100",
    "replica.fetch.backoff.ms": "200",
}

LEO_HW_ATTRIBUTES = ("Leader LEO", "Follower LEO", f"Remote LEO (broker {FOLLOWER})", "Leader HW", "Follower HW")

# --- the brokers' HTTP endpoints ---------------------------------------------------------------------------


def wait_for_follower_to_lead(cluster: LocalCluster, topic: str, old_epoch: int) -> dict[str, Any]:
    """The old follower's own status once it leads `topic`-0 in an epoch above `old_epoch`."""

    def follower_leads() -> dict[str, Any] | None:
        status = replica_state(cluster, FOLLOWER, topic)
        return (
            status if status is not None and status["role"] == "leader" and status["leader_epoch"] > old_epoch else None
        )

    return wait_until(
        follower_leads,
        FAILOVER_S,
        lambda: f"broker {FOLLOWER} leading {topic}-0 in an epoch above {old_epoch}; {statuses(cluster, topic)}",
    )


def statuses(cluster: LocalCluster, topic: str) -> str:
    """Both replicas' /v1/partitions answers, for failure messages."""
    return "; ".join(f"broker {n}: {replica_state(cluster, n, topic)}" for n in (LEADER, FOLLOWER))


def metric_value(cluster: LocalCluster, node_id: int, name: str) -> float:
    """The value of an unlabelled metric in broker `node_id`'s /metrics (Prometheus text)."""
    text = http_get(cluster.http_address(node_id), "/metrics").decode()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == name:
            return float(fields[1])
    raise AssertionError(f"no metric {name} on broker {node_id}'s /metrics:\n{text}")


class TraceStream:
    """Reads one broker's never-ending `/v1/trace` NDJSON stream of a partition on a thread of its own.

    HTTP/1.1 chunked encoding is decoded by hand over a plain socket: the socket's short timeout lets the
    thread notice `close()` quickly, which a blocking urllib read would not."""

    def __init__(self, address: str, topic: str, partition: int = 0) -> None:
        host, port = address.rsplit(":", 1)
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sock = socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT_S)
        self._sock.sendall(
            f"GET /v1/trace?topic={topic}&partition={partition} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode()
        )
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._run, name=f"trace-{address}", daemon=True)
        self._thread.start()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        self._closing.set()
        self._thread.join(5)
        self._sock.close()

    def _recv(self) -> bytes:
        while not self._closing.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("the broker closed the trace stream")
            return data
        raise EOFError

    def _run(self) -> None:
        buffer = b""
        body = b""
        try:
            while b"\r\n\r\n" not in buffer:
                buffer += self._recv()
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            if not head.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(f"/v1/trace answered {head.decode(errors='replace')!r}")
            while True:
                # A chunk: hex size line, data, CRLF.
                while b"\r\n" not in buffer:
                    buffer += self._recv()
                size_line, buffer = buffer.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    return
                while len(buffer) < size + 2:
                    buffer += self._recv()
                body += buffer[:size]
                buffer = buffer[size + 2 :]
                *lines, body = body.split(b"\n")
                parsed = [json.loads(line) for line in lines if line.strip()]
                with self._lock:
                    self.events.extend(parsed)
        except EOFError:
            return
        except BaseException as error:  # reported by the test that reads the stream, not lost in a thread
            self.error = error


def merged_events(streams: Mapping[int, TraceStream], after_seq: Mapping[int, int]) -> list[dict[str, Any]]:
    """Events of every stream with a seq above `after_seq[broker]`, merged by time, then seq."""
    events = [
        e for node_id, s in streams.items() for e in s.snapshot() if e.get("seq", -1) > after_seq.get(node_id, -1)
    ]
    return sorted(events, key=lambda e: (e["time_ms"], e["seq"]))


def table(events: list[dict[str, Any]]) -> str:
    """Events as seed 000's tables show them: attribute, phase, old, new, why (plus when and where)."""
    rows = [
        f"{'time_ms':>13}  {'broker':>6}  {'seq':>4}  {'attribute':<22}  {'phase':<20}  {'old':>9}  {'new':>9}  why"
    ]
    for e in events:
        if "dropped" in e:
            rows.append(f"{'':>13}  {e['broker_id']:>6}  {'':>4}  ({e['dropped']} events dropped)")
            continue
        rows.append(
            f"{e['time_ms']:>13}  {e['broker_id']:>6}  {e['seq']:>4}  {e['attribute']:<22}  {e['phase']:<20}  "
            f"{e['old']!s:>9}  {e['new']!s:>9}  {e['why']}"
        )
    return "\n".join(rows)


# --- clients ----------------------------------------------------------------------------------------------


def create_topic(cluster: LocalCluster, topic: str, config: Mapping[str, str]) -> None:
    """`topic` with one partition on brokers [2, 3] (2 preferred leader); wait until 2 leads it with ISR [2, 3]
    and 3 follows it."""
    admin = AdminClient({"bootstrap.servers": cluster.broker(1).bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replica_assignment=[[LEADER, FOLLOWER]], config=dict(config))],
        request_timeout=CLIENT_TIMEOUT_S,
    )
    futures[topic].result(timeout=CLIENT_TIMEOUT_S)

    def ready() -> bool:
        leader, follower = replica_state(cluster, LEADER, topic), replica_state(cluster, FOLLOWER, topic)
        return (
            leader is not None
            and follower is not None
            and leader["role"] == "leader"
            and sorted(leader["isr"]) == [LEADER, FOLLOWER]
            and follower["role"] == "follower"
            and follower["leader"] == LEADER
        )

    wait_until(
        ready, CONVERGE_S, lambda: f"broker {LEADER} leading {topic} with ISR [2, 3]; {statuses(cluster, topic)}"
    )


def produce_one(bootstrap: str, topic: str, value: bytes, acks: str, **config: object) -> tuple[KafkaError | None, int]:
    """Produce one record to partition 0 and wait for its delivery report: (error or None, offset)."""
    settings: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "message.timeout.ms": int(CLIENT_TIMEOUT_S * 1000),
        "enable.idempotence": False,
    }
    settings.update(config)
    producer = Producer(settings)
    reports: list[tuple[KafkaError | None, int]] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        offset = message.offset()
        reports.append((error, -1 if offset is None else offset))

    producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
    remaining = producer.flush(CLIENT_TIMEOUT_S + 5)
    assert remaining == 0 and len(reports) == 1, f"no delivery report for {value!r} within {CLIENT_TIMEOUT_S + 5}s"
    return reports[0]


def produce_acked(bootstrap: str, topic: str, value: bytes, acks: str) -> int:
    error, offset = produce_one(bootstrap, topic, value, acks)
    assert error is None, f"producing {value!r} with acks={acks} failed: {error}"
    return offset


def records(kafka: Any, bootstrap: str, topic: str) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record of `topic`-0 below the high watermark, asked of `bootstrap`."""
    return [(r.offset, r.value) for r in kafka.consume_all(bootstrap, topic)]


def metadata_isr(cluster: LocalCluster, topic: str, node_id: int) -> list[int] | None:
    """The ISR of `topic`-0 in a Metadata answer of broker `node_id` (None if it did not answer in time)."""
    partition = metadata_partition(cluster.broker(node_id).bootstrap, topic, 0, timeout_s=3)
    return None if partition is None else sorted(partition.isrs)


# --- files --------------------------------------------------------------------------------------------------


def checkpointed_hw(cluster: LocalCluster, node_id: int, topic: str) -> int | None:
    """The HW of `topic`-0 in broker `node_id`'s replication-offset-checkpoint (Kafka's text format)."""
    path = cluster.broker(node_id).log_dir / "replication-offset-checkpoint"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        name, partition, offset = line.split()
        if name == topic and partition == "0":
            return int(offset)
    return None


def segment_files(cluster: LocalCluster, node_id: int, topic: str) -> dict[str, bytes]:
    directory = cluster.broker(node_id).log_dir / f"{topic}-0"
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.log"))}


@pytest.fixture
def trace_streams() -> Iterator[Callable[[LocalCluster, int, str], TraceStream]]:
    """`open_trace(cluster, node_id, topic)`: a TraceStream of `topic`-0, closed when the test ends."""
    streams: list[TraceStream] = []

    def open_trace(cluster: LocalCluster, node_id: int, topic: str) -> TraceStream:
        stream = TraceStream(cluster.http_address(node_id), topic)
        streams.append(stream)
        return stream

    try:
        yield open_trace
    finally:
        for stream in streams:
            stream.close()


def topic_name(story: str) -> str:
    return f"{story}-{uuid.uuid4().hex[:6]}"


# --- seed 000: the two FETCH rounds -------------------------------------------------------------------------


def test_seed_000_two_round_hw_propagation(
    cluster_factory: ClusterFactory, trace_streams: Callable[[LocalCluster, int, str], TraceStream]
) -> None:
    cluster = cluster_factory(BASE_OVERRIDES)
    topic = topic_name("seed-000")
    create_topic(cluster, topic, {"min.insync.replicas": "1"})
    streams = {LEADER: trace_streams(cluster, LEADER, topic), FOLLOWER: trace_streams(cluster, FOLLOWER, topic)}

    # Seed 000 starts with the follower already fetching (its FETCHes wait in the leader's purgatory): the
    # leader knows its remote LEO, 0, and the streams have delivered everything up to then.
    remote_leo = f"Remote LEO (broker {FOLLOWER})"

    def fetching() -> bool:
        status = replica_state(cluster, LEADER, topic)
        known = (
            status is not None and status.get("remote_replicas", {}).get(str(FOLLOWER), {}).get("log_end_offset") == 0
        )
        traced = any(e.get("attribute") == remote_leo and e.get("new") == 0 for e in streams[LEADER].snapshot())
        return known and traced

    wait_until(
        fetching,
        CONVERGE_S,
        lambda: f"broker {FOLLOWER} fetching (remote LEO 0 on the leader); {statuses(cluster, topic)}",
    )
    before = {node_id: max((e.get("seq", -1) for e in s.snapshot()), default=-1) for node_id, s in streams.items()}

    offset = produce_acked(cluster.broker(LEADER).bootstrap, topic, b"m", acks="1")
    assert offset == 0

    def follower_hw_reached() -> bool:
        return any(e.get("attribute") == "Follower HW" and e.get("new") == 1 for e in merged_events(streams, before))

    wait_until(
        follower_hw_reached,
        CONVERGE_S,
        lambda: (
            "the follower's HW to reach 1 (second FETCH round); merged trace after the produce:\n"
            + table(merged_events(streams, before))
        ),
    )
    # Anything after the second round would be an extra transition: give it a moment to show up.
    time.sleep(0.5)
    for node_id, stream in streams.items():
        assert stream.error is None, f"broker {node_id}'s trace stream failed: {stream.error!r}"
    events = merged_events(streams, before)
    watched = [e for e in events if e.get("attribute") in LEO_HW_ATTRIBUTES]
    expected = [
        ("Leader LEO", 0, 1),  # PRODUCE appended m
        ("Follower LEO", 0, 1),  # first FETCH round: the follower has m, its HW stays min(leader HW 0, LEO 1) = 0
        (remote_leo, 0, 1),  # second FETCH round: the follower's fetch offset 1 on the leader...
        ("Leader HW", 0, 1),  # ...makes HW = min(leader LEO 1, remote LEO 1) = 1
        ("Follower HW", 0, 1),  # the second FETCH response carries HW 1
    ]
    shown = f"merged trace after the produce:\n{table(events)}"
    print(shown)
    assert sorted((e["attribute"], e["old"], e["new"]) for e in watched) == sorted(expected), shown
    # Brokers stamp events with their own millisecond clock (one host, so one clock), and seq is per broker:
    # events of two brokers in the same millisecond have no order to check. The seed's order must therefore
    # be the one that the timestamps and each broker's seq agree with; where no tie occurs that is exactly
    # the (time_ms, seq) merge.
    by_triple = {(e["attribute"], e["old"], e["new"]): e for e in watched}
    in_seed_order = [by_triple[triple] for triple in expected]
    for earlier, later in itertools.pairwise(in_seed_order):
        assert earlier["time_ms"] <= later["time_ms"], (
            f"{later['attribute']} came before {earlier['attribute']}; {shown}"
        )
        if earlier["broker_id"] == later["broker_id"]:
            assert earlier["seq"] < later["seq"], f"{later['attribute']} came before {earlier['attribute']}; {shown}"
    assert [e["broker_id"] for e in in_seed_order] == [LEADER, FOLLOWER, LEADER, LEADER, FOLLOWER], shown


# --- seed 002: the HW data loss story ----------------------------------------------------------------------


FOLLOWER_FETCH_WAIT_MS = 6000


def test_seed_002_hw_data_loss_story_keeps_the_acknowledged_message(
    cluster_factory: ClusterFactory, trace_streams: Callable[[LocalCluster, int, str], TraceStream], kafka: Any
) -> None:
    # A follower FETCH with nothing new waits 6 s at the leader, so after the second FETCH round of m1 (the one
    # that lets the leader's HW and the acks=all answer pass m1) the follower holds m1 with HW 0 for 6 s: the
    # state in which the old, HW-based truncation lost m1. (Longer only slows the rejoin below: a restarted
    # follower's first FETCH may come while the leader still sees it fenced, and the next one waits this long.)
    cluster = cluster_factory({**BASE_OVERRIDES, "replica.fetch.wait.max.ms": str(FOLLOWER_FETCH_WAIT_MS)})
    topic = topic_name("seed-002-loss")
    create_topic(cluster, topic, {"min.insync.replicas": "1"})
    wait_until(
        lambda: (
            (replica_state(cluster, LEADER, topic) or {})
            .get("remote_replicas", {})
            .get(str(FOLLOWER), {})
            .get("log_end_offset")
            == 0
        ),
        CONVERGE_S,
        lambda: f"broker {FOLLOWER} fetching; {statuses(cluster, topic)}",
    )

    assert produce_acked(cluster.broker(LEADER).bootstrap, topic, b"m1", acks="all") == 0
    acked_at = time.monotonic()
    follower = replica_state(cluster, FOLLOWER, topic)
    assert follower is not None and (follower["log_end_offset"], follower["high_watermark"]) == (1, 0), (
        f"the follower should hold m1 with HW 0 after the acks=all answer; {statuses(cluster, topic)}"
    )
    leader = replica_state(cluster, LEADER, topic)
    assert leader is not None and leader["high_watermark"] == 1, statuses(cluster, topic)
    # The HW on disk is what a restarted broker starts from: it must say 0 for the story to be the seed's.
    # It was 0 since the topic was created and the checkpoint is written every 100 ms.
    wait_until(lambda: checkpointed_hw(cluster, FOLLOWER, topic) is not None, 5, "the follower's HW checkpoint")
    assert checkpointed_hw(cluster, FOLLOWER, topic) == 0
    assert time.monotonic() - acked_at < FOLLOWER_FETCH_WAIT_MS / 1000 - 1.5, (
        "too slow: the follower may have learnt HW 1 before the crash"
    )

    cluster.kill(FOLLOWER)
    cluster.restart(FOLLOWER, timeout_s=CLUSTER_START_S)
    restarted = trace_streams(cluster, FOLLOWER, topic)

    # The restarted follower starts from LEO 1 and HW 0 and must not cut m1 off: its epoch cache says epoch 0
    # goes on past offset 0, and the leader agrees. Truncating to the stale HW is the old bug.
    status = wait_until(
        lambda: replica_state(cluster, FOLLOWER, topic),
        CONVERGE_S,
        f"the restarted broker {FOLLOWER} to load {topic}-0",
    )
    assert (status["log_end_offset"], status["high_watermark"]) == (1, 0), (
        f"the restarted follower should hold m1 with its checkpointed HW 0; {statuses(cluster, topic)}"
    )

    def back_in_isr() -> bool:
        leader, follower = replica_state(cluster, LEADER, topic), replica_state(cluster, FOLLOWER, topic)
        return (
            leader is not None
            and sorted(leader["isr"]) == [LEADER, FOLLOWER]
            and follower is not None
            and follower["role"] == "follower"
            and sorted(follower["isr"]) == [LEADER, FOLLOWER]
        )

    wait_until(back_in_isr, CONVERGE_S, lambda: f"broker {FOLLOWER} back in the ISR; {statuses(cluster, topic)}")
    follower = replica_state(cluster, FOLLOWER, topic)
    assert follower is not None and follower["log_end_offset"] == 1, statuses(cluster, topic)
    truncations = [e for e in restarted.snapshot() if e.get("phase") == "truncate"]
    assert not truncations, f"the restarted follower truncated:\n{table(truncations)}"
    old_epoch = follower["leader_epoch"]

    cluster.kill(LEADER)

    new_leader = wait_for_follower_to_lead(cluster, topic, old_epoch)
    assert new_leader["log_end_offset"] == 1, new_leader
    wait_until(
        lambda: (replica_state(cluster, FOLLOWER, topic) or {}).get("high_watermark") == 1,
        CONVERGE_S,
        lambda: f"the new leader's HW to cover m1; {statuses(cluster, topic)}",
    )
    assert records(kafka, cluster.broker(FOLLOWER).bootstrap, topic) == [(0, b"m1")]
    assert restarted.error is None, restarted.error
    truncations = [e for e in restarted.snapshot() if e.get("phase") == "truncate"]
    assert not truncations, f"broker {FOLLOWER} truncated:\n{table(truncations)}"


# --- seed 002: the divergence story -------------------------------------------------------------------------


def test_seed_002_divergence_story_ends_with_identical_logs(
    cluster_factory: ClusterFactory, trace_streams: Callable[[LocalCluster, int, str], TraceStream], kafka: Any
) -> None:
    # Short follower fetch waits, so a FETCH parked at the leader when the follower is frozen expires (its
    # empty answer waits in the frozen follower's socket) before m1 arrives: m1 must stay on the leader alone.
    fetch_wait_ms = 200
    cluster = cluster_factory({**BASE_OVERRIDES, "replica.fetch.wait.max.ms": str(fetch_wait_ms)})
    topic = topic_name("seed-002-diverge")
    create_topic(cluster, topic, {"min.insync.replicas": "1"})
    leader_bootstrap = cluster.broker(LEADER).bootstrap

    assert produce_acked(leader_bootstrap, topic, b"m0", acks="all") == 0
    wait_until(
        lambda: (replica_state(cluster, FOLLOWER, topic) or {}).get("high_watermark") == 1,
        CONVERGE_S,
        lambda: f"both replicas to hold m0 with HW 1; {statuses(cluster, topic)}",
    )
    old_epoch = (replica_state(cluster, LEADER, topic) or {})["leader_epoch"]

    # The follower freezes for well under its session timeout, so it stays a live, unfenced ISR member.
    paused_at = time.monotonic()
    cluster.pause(FOLLOWER)
    try:
        time.sleep(3 * fetch_wait_ms / 1000)
        assert produce_acked(leader_bootstrap, topic, b"m1", acks="1") == 1
        leader = replica_state(cluster, LEADER, topic)
        assert leader is not None and leader["log_end_offset"] == 2, statuses(cluster, topic)
        cluster.kill(LEADER)
    finally:
        cluster.resume(FOLLOWER)
    paused_s = time.monotonic() - paused_at
    assert paused_s < SESSION_TIMEOUT_MS / 1000 - 0.5, f"the follower was frozen {paused_s:.1f}s: it may be fenced"

    new_leader = wait_for_follower_to_lead(cluster, topic, old_epoch)
    assert new_leader["log_end_offset"] == 1, f"m1 reached the follower after all, no divergence to heal: {new_leader}"

    # The new leader takes m2 at offset 1, where the old leader holds m1: two logs, same offset, other data.
    assert produce_acked(cluster.broker(FOLLOWER).bootstrap, topic, b"m2", acks="1") == 1

    cluster.restart(LEADER, timeout_s=CLUSTER_START_S)
    old_leader_trace = trace_streams(cluster, LEADER, topic)

    def identical_positions() -> bool:
        a, b = replica_state(cluster, LEADER, topic), replica_state(cluster, FOLLOWER, topic)
        return (
            a is not None
            and b is not None
            and b["role"] == "leader"
            and a["role"] == "follower"
            and (a["log_end_offset"], a["high_watermark"]) == (2, 2)
            and (b["log_end_offset"], b["high_watermark"]) == (2, 2)
            and sorted(b["isr"]) == [LEADER, FOLLOWER]
        )

    wait_until(
        identical_positions,
        CONVERGE_S,
        lambda: (
            f"both replicas at LEO 2 and HW 2, both in the ISR; {statuses(cluster, topic)}"
            + "\nold leader's trace:\n"
            + table(old_leader_trace.snapshot())
        ),
    )

    # The old leader cut m1 off where the new leader's epoch says its own epoch ended (DivergingEpoch), not
    # at its HW by chance: the trace says why.
    truncations = [
        e for e in old_leader_trace.snapshot() if e.get("phase") == "truncate" and e.get("attribute") == "Follower LEO"
    ]
    assert [(e["old"], e["new"]) for e in truncations] == [(2, 1)], table(old_leader_trace.snapshot())
    assert "diverging epoch" in truncations[0]["why"], table(truncations)

    # Byte-identical segments: the follower appends the leader's batches as they are, CRCs included.
    old_leader_files, new_leader_files = segment_files(cluster, LEADER, topic), segment_files(cluster, FOLLOWER, topic)
    assert list(old_leader_files) == list(new_leader_files) == ["00000000000000000000.log"]
    batches = {
        node_id: [
            (
                b.header.base_offset,
                b.header.partition_leader_epoch,
                b.header.crc,
                [(r.offset, r.value) for r in b.records],
            )
            for b in decode_batches(files["00000000000000000000.log"])
        ]
        for node_id, files in ((LEADER, old_leader_files), (FOLLOWER, new_leader_files))
    }
    assert batches[LEADER] == batches[FOLLOWER], batches
    assert [(base, epoch, records) for base, epoch, _, records in batches[FOLLOWER]] == [
        (0, old_epoch, [(0, b"m0")]),
        (1, new_leader["leader_epoch"], [(1, b"m2")]),
    ], batches
    assert old_leader_files == new_leader_files
    assert records(kafka, cluster.bootstrap, topic) == [(0, b"m0"), (1, b"m2")]
    assert old_leader_trace.error is None, old_leader_trace.error


# --- seed 003/004: ISR shrink and expand ----------------------------------------------------------------------


def test_slow_follower_leaves_isr_and_rejoins_and_acks_all_is_refused_below_min_isr(
    cluster_factory: ClusterFactory, kafka: Any
) -> None:
    # The session outlasts the pause, so the controller never fences the frozen broker: the shrink can only
    # come from the leader's own lag check (every replica.lag.time.max.ms / 2).
    cluster = cluster_factory(
        {**BASE_OVERRIDES, "replica.lag.time.max.ms": "1500", "broker.session.timeout.ms": "20000"}
    )
    topic = topic_name("isr")
    create_topic(cluster, topic, {"min.insync.replicas": "2"})
    leader_bootstrap = cluster.broker(LEADER).bootstrap
    assert produce_acked(leader_bootstrap, topic, b"before", acks="all") == 0

    cluster.pause(FOLLOWER)
    try:
        # acks=1 moves the leader's LEO past the frozen follower's.
        for i in range(3):
            produce_acked(leader_bootstrap, topic, f"while-frozen-{i}".encode(), acks="1")
        wait_until(
            lambda: (replica_state(cluster, LEADER, topic) or {}).get("isr") == [LEADER],
            10,
            lambda: f"the leader to shrink the ISR to [{LEADER}]; leader: {replica_state(cluster, LEADER, topic)}",
        )
        wait_until(
            lambda: all(metadata_isr(cluster, topic, node_id) == [LEADER] for node_id in (1, LEADER)),
            10,
            lambda: (
                f"Metadata of brokers 1 and {LEADER} to show ISR [{LEADER}]; "
                f"{[metadata_isr(cluster, topic, n) for n in (1, LEADER)]}"
            ),
        )

        error, _ = produce_one(
            leader_bootstrap, topic, b"refused", acks="all", retries=0, **{"message.timeout.ms": 5000}
        )
        assert error is not None and error.code() == KafkaError.NOT_ENOUGH_REPLICAS, (
            f"acks=all below min.insync.replicas answered {error}"
        )
    finally:
        cluster.resume(FOLLOWER)

    wait_until(
        lambda: sorted((replica_state(cluster, LEADER, topic) or {}).get("isr", [])) == [LEADER, FOLLOWER],
        CONVERGE_S,
        lambda: f"broker {FOLLOWER} back in the ISR; {statuses(cluster, topic)}",
    )
    wait_until(
        lambda: all(metadata_isr(cluster, topic, node_id) == [LEADER, FOLLOWER] for node_id in cluster.node_ids),
        CONVERGE_S,
        lambda: (
            f"every broker's Metadata to show ISR [2, 3]; {[metadata_isr(cluster, topic, n) for n in cluster.node_ids]}"
        ),
    )
    assert produce_acked(leader_bootstrap, topic, b"after", acks="all") == 4
    assert [value for _, value in records(kafka, leader_bootstrap, topic)] == [
        b"before",
        b"while-frozen-0",
        b"while-frozen-1",
        b"while-frozen-2",
        b"after",
    ]
    assert metric_value(cluster, LEADER, "kafka_server_replicamanager_isrshrinks_total") >= 1
    assert metric_value(cluster, LEADER, "kafka_server_replicamanager_isrexpands_total") >= 1


# --- ISR expansion while the proposing FETCH waits in the purgatory ---------------------------------------------


def test_isr_expansion_reaches_the_controller_while_the_follower_fetch_waits(cluster_factory: ClusterFactory) -> None:
    # A caught-up follower's FETCH proposes its return to the ISR on arrival, then waits at the leader for new
    # data up to replica.fetch.wait.max.ms. As Kafka's AlterPartitionManager does, the proposal must go to the
    # controller at once, not when that FETCH is finally answered. (The ISR-expiration timer, every
    # replica.lag.time.max.ms / 2, also flushes proposals: the default 30 s keeps it out of the picture.)
    fetch_wait_ms = 4000
    cluster = cluster_factory({**BASE_OVERRIDES, "replica.fetch.wait.max.ms": str(fetch_wait_ms)})
    topic = topic_name("isr-expand")
    create_topic(cluster, topic, {"min.insync.replicas": "1"})
    assert produce_acked(cluster.broker(LEADER).bootstrap, topic, b"m0", acks="all") == 0

    # A controlled shutdown takes the follower out of the ISR; back, it catches up at once (nothing is new)
    # and its next FETCH has it proposed back.
    cluster.restart(FOLLOWER, timeout_s=CLUSTER_START_S)

    def expansion_proposed() -> dict[str, Any] | None:
        status = replica_state(cluster, LEADER, topic)
        return status if status is not None and FOLLOWER in status["maximal_isr"] else None

    proposed = wait_until(
        expansion_proposed,
        CONVERGE_S,
        lambda: f"the leader to propose broker {FOLLOWER} back into the ISR; {statuses(cluster, topic)}",
    )
    proposed_at = time.monotonic()
    committed_within_s = 2.0
    try:
        wait_until(
            lambda: FOLLOWER in (replica_state(cluster, LEADER, topic) or {}).get("isr", []),
            committed_within_s,
            lambda: f"the controller to commit the expansion (proposed: {proposed}); {statuses(cluster, topic)}",
        )
    except TimeoutError as error:
        wait_until(
            lambda: FOLLOWER in (replica_state(cluster, LEADER, topic) or {}).get("isr", []),
            fetch_wait_ms / 1000 + CONVERGE_S,
            lambda: f"the expansion to be committed at all; {statuses(cluster, topic)}",
        )
        raise AssertionError(
            f"{error}; it was committed only {time.monotonic() - proposed_at:.1f}s after it was proposed, "
            f"when the follower's FETCH (replica.fetch.wait.max.ms={fetch_wait_ms}) was answered"
        ) from None
