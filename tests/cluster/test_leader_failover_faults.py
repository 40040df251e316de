"""Leader crashes under load: three real broker processes, acks=all, the leader SIGKILLed again and again.

The contract (docs/replication.md): a record acknowledged with acks=all is never lost and never moves to another
offset, however often leaders crash; retries may duplicate a record (idempotence is off), but no offset ever
holds two different records, and once the replicas have converged every replica's log is byte-identical up
to the high watermark. Each kill picks the *current* leader of a partition (Metadata, confirmed by that
broker's own /v1/partitions), so the epochs bump and followers must truncate by epoch each time.

Every wait is bounded and names what it waited for; the brokers' log tails are printed at the end, so a
failing run shows what each broker said.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_helpers import (
    BackgroundProducer,
    ClusterFactory,
    create_topic_with_leaders,
    describe_partitions,
    partition_views,
    wait_confirmed_leader,
)
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import NewTopic

from tierlog.records.codec import decode_batches
from tierlog.testing.local_cluster import LocalCluster, wait_until

TOPIC = "failover"
PARTITIONS = (0, 1)
BROKERS = (1, 2, 3)
# Fast failure detection, so a killed leader loses its leaderships within ~2 s; small segments, so the run
# rolls segments and the byte comparison spans several files. A slow follower (two CPUs, three brokers)
# may drop out of the ISR and come back; that is a fault the test must survive too.
OVERRIDES = {
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "5000",
    "replica.high.watermark.checkpoint.interval.ms": "500",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "log.segment.bytes": str(256 * 1024),
}
# (partition whose leader dies, seconds the dead broker stays down). Some restarts come before the 2 s
# session timeout (the controller fences the old incarnation when the new one registers), some after it.
ROUNDS = ((0, 0.5), (1, 2.5), (0, 1.0), (1, 3.0), (0, 1.5), (1, 0.2))
# Produced per partition every PRODUCE_TICK_S: about 500 records/s per partition at most, enough for
# segment rolls without starving three Python brokers on two cores.
BURST = 10
PRODUCE_TICK_S = 0.02
MAX_QUEUED = 5000
PADDING = "x" * 100

RESTART_S = 60.0
REJOIN_S = 45.0
LEADER_S = 30.0
CONVERGE_S = 60.0
FLUSH_S = 60.0
SETTLE_S = 2.0


@dataclass
class Acks:
    """What the delivery callbacks saw: every acknowledged (partition, offset, value), and the failures."""

    acked: list[tuple[int, int, bytes]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    produced: int = 0

    def on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            # Not acknowledged, so not covered by the contract; counted to show how much the faults cost.
            self.failed.append(str(error))
            return
        offset = message.offset()
        value = message.value()
        assert offset is not None and offset >= 0 and value is not None, f"acknowledged without an offset: {message}"
        self.acked.append((message.partition() or 0, offset, value))


class ProducerThread(BackgroundProducer):
    """Produces unique values (`{partition}-{seq}`) to both partitions until finished."""

    def __init__(self, bootstrap: str) -> None:
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            # Duplicates are allowed by this test's contract; the broker must not lose or move records.
            "enable.idempotence": False,
            "retries": 1_000_000,
            "retry.backoff.ms": 100,
            "retry.backoff.max.ms": 500,
            "linger.ms": 5,
            "request.timeout.ms": 5000,
            "message.timeout.ms": 60_000,
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000,
        }
        super().__init__("failover-producer", config, tick_s=PRODUCE_TICK_S, max_queued=MAX_QUEUED, flush_s=FLUSH_S)
        self.acks = Acks()
        self.seq = 0

    def produce_burst(self) -> None:
        for _ in range(BURST):
            for partition in PARTITIONS:
                value = f"{partition}-{self.seq:09d}-{PADDING}".encode()
                self.producer.produce(TOPIC, value=value, partition=partition, on_delivery=self.acks.on_delivery)
                self.acks.produced += 1
            self.seq += 1


def rejoined(cluster: LocalCluster, node_id: int) -> dict[int, int] | None:
    """partition -> leader epoch once `node_id` is back in the ISR of every partition, as each leader reports."""
    seen = partition_views(cluster, TOPIC)
    epochs: dict[int, int] = {}
    for partition in PARTITIONS:
        leaders = [v[partition] for v in seen.values() if v and partition in v and v[partition]["role"] == "leader"]
        if not leaders:
            return None
        newest = max(leaders, key=lambda s: s["leader_epoch"])
        if node_id not in newest["isr"]:
            return None
        epochs[partition] = int(newest["leader_epoch"])
    return epochs


def converged(cluster: LocalCluster) -> dict[int, dict[str, Any]] | None:
    """partition -> the leader's state once every replica has the same LEO == HW and the ISR is full."""
    seen = partition_views(cluster, TOPIC)
    if any(v is None for v in seen.values()):
        return None
    result: dict[int, dict[str, Any]] = {}
    for partition in PARTITIONS:
        states = [v[partition] for v in seen.values() if v is not None and partition in v]
        if len(states) != len(BROKERS):
            return None
        ends = {(s["log_end_offset"], s["high_watermark"]) for s in states}
        leaders = [s for s in states if s["role"] == "leader"]
        if len(ends) != 1 or len(leaders) != 1:
            return None
        leo, hw = ends.pop()
        if leo != hw or sorted(leaders[0]["isr"]) != list(BROKERS):
            return None
        result[partition] = leaders[0]
    return result


@dataclass(frozen=True)
class StoredBatch:
    base_offset: int
    last_offset: int
    crc: int
    leader_epoch: int
    raw: bytes
    records: tuple[tuple[int, bytes | None], ...]


def stored_batches(partition_dir: Path, high_watermark: int) -> list[StoredBatch]:
    """The batches of every .log segment of a partition directory, in offset order, that start below the HW."""
    batches: list[StoredBatch] = []
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        consumed = 0
        for batch in decode_batches(data):
            h = batch.header
            consumed = h.position + h.size_in_bytes
            if h.base_offset >= high_watermark:
                continue
            raw = data[h.position : h.position + h.size_in_bytes]
            records = tuple((r.offset, r.value) for r in batch.records)
            batches.append(StoredBatch(h.base_offset, h.last_offset, h.crc, h.partition_leader_epoch, raw, records))
        # decode_batches stops quietly at a partial batch; a cleanly stopped broker's segments hold none.
        assert consumed == len(data), f"{segment} ends with {len(data) - consumed} bytes that are not a whole batch"
    return batches


def test_leader_killed_again_and_again_loses_no_acknowledged_record(
    cluster_factory: ClusterFactory, kafka: Any
) -> None:
    started = time.monotonic()
    cluster = cluster_factory(OVERRIDES, brokers=len(BROKERS))
    producer: ProducerThread | None = None
    kills: list[tuple[int, int, int, int]] = []  # (partition, killed leader, epoch before, epoch after)
    try:
        new_topic = NewTopic(TOPIC, num_partitions=len(PARTITIONS), replication_factor=len(BROKERS))
        new_topic.config = {"min.insync.replicas": "2"}
        create_topic_with_leaders(cluster, new_topic, len(PARTITIONS), LEADER_S)

        producer = ProducerThread(cluster.bootstrap)
        producer.start()
        acks = producer.acks
        wait_until(lambda: len(acks.acked) >= 200, 30, lambda: f"200 acknowledgements (have {len(acks.acked)})")

        for round_no, (partition, down_s) in enumerate(ROUNDS, 1):
            leader, epoch_before = wait_confirmed_leader(cluster, TOPIC, partition, LEADER_S, f"round {round_no}: ")
            acked_before = len(acks.acked)
            cluster.kill(leader)
            time.sleep(down_s)
            cluster.restart(leader, timeout_s=RESTART_S)
            epochs = wait_until(
                lambda n=leader: rejoined(cluster, n),
                REJOIN_S,
                lambda n=leader, r=round_no: (
                    f"round {r}: broker {n} back in every ISR ({describe_partitions(cluster, TOPIC)})"
                ),
            )
            kills.append((partition, leader, epoch_before, epochs[partition]))
            print(
                f"round {round_no}: killed broker {leader} (leader of p{partition}, epoch {epoch_before}) for "
                f"{down_s}s; rejoined, epochs now {epochs}; acknowledged {acked_before} -> {len(acks.acked)}",
                flush=True,
            )
            # A killed leader loses its leaderships (fenced on session timeout, or when its next incarnation
            # registers), so every round must have moved the partition to a new epoch.
            assert epochs[partition] > epoch_before, (
                f"round {round_no}: p{partition} still at epoch {epochs[partition]} after its leader {leader} "
                f"was killed (epoch before {epoch_before})"
            )
            # Records under the new leader before the next crash, so each epoch holds data.
            time.sleep(SETTLE_S)

        producer.finish()
        final = wait_until(
            lambda: converged(cluster),
            CONVERGE_S,
            lambda: f"every replica at LEO == HW with the full ISR ({describe_partitions(cluster, TOPIC)})",
        )
        high_watermarks = {p: int(final[p]["high_watermark"]) for p in PARTITIONS}
        final_epochs = {p: int(final[p]["leader_epoch"]) for p in PARTITIONS}
        summary = (
            f"{len(acks.acked)} acknowledged of {acks.produced} produced ({len(acks.failed)} failed, "
            f"{producer.unflushed} unflushed), {len(kills)} kills {kills}, leader epochs {final_epochs}, "
            f"HW {high_watermarks}"
        )
        print(summary, flush=True)
        assert len(acks.acked) > 1000, f"too little was acknowledged to mean anything: {summary}"

        # Two acknowledgements of different records at one offset would already be a divergence.
        acked_at: dict[tuple[int, int], bytes] = {}
        clashes = []
        for partition, offset, value in acks.acked:
            if acked_at.setdefault((partition, offset), value) != value:
                clashes.append((partition, offset, acked_at[(partition, offset)], value))
        assert not clashes, f"{len(clashes)} offsets acknowledged for two records, first {clashes[:3]}; {summary}"
        beyond = [(p, o) for (p, o) in acked_at if o >= high_watermarks[p]]
        assert not beyond, f"{len(beyond)} acknowledged offsets at or above the final HW, first {beyond[:5]}"

        # (a) every acknowledged record reads back at exactly its offset, as a consumer sees it.
        consumed = {(r.partition, r.offset): r.value for r in kafka.consume_all(cluster.bootstrap, TOPIC, PARTITIONS)}
        for partition in PARTITIONS:
            got = sorted(o for (p, o) in consumed if p == partition)
            assert got == list(range(high_watermarks[partition])), (
                f"p{partition}: consumed offsets are not 0..{high_watermarks[partition] - 1} "
                f"({len(got)} offsets, first gap near {next((i for i, o in enumerate(got) if o != i), None)})"
            )
        lost = [(p, o, v, consumed.get((p, o))) for (p, o), v in acked_at.items() if consumed.get((p, o)) != v]
        assert not lost, f"{len(lost)} acknowledged records not at their offset, first {lost[:3]}; {summary}"
        duplicates = len(consumed) - len({v for v in consumed.values()})
    finally:
        if producer is not None:
            producer.close()
        # The comparison below reads the segment files of cleanly stopped brokers.
        cluster.stop()

    # (b) after a clean stop every replica's log holds the same batches, byte for byte, up to the HW, and
    # (c) no offset holds two different records: each replica's records equal the acknowledged ones.
    for partition in PARTITIONS:
        hw = high_watermarks[partition]
        logs = {node: stored_batches(cluster.broker(node).log_dir / f"{TOPIC}-{partition}", hw) for node in BROKERS}
        reference = logs[BROKERS[0]]
        assert reference and reference[0].base_offset == 0, f"p{partition}: broker 1's log does not start at 0"
        for before, after in itertools.pairwise(reference):
            assert after.base_offset == before.last_offset + 1, (
                f"p{partition}: batches at {before.base_offset}..{before.last_offset} and {after.base_offset} "
                "are not contiguous"
            )
        assert reference[-1].last_offset + 1 == hw, f"p{partition}: log ends at {reference[-1].last_offset}, HW {hw}"
        for node, batches in logs.items():
            assert len(batches) == len(reference), (
                f"p{partition}: broker {node} has {len(batches)} batches below HW {hw}, broker 1 {len(reference)}"
            )
            for mine, theirs in zip(batches, reference, strict=True):
                assert mine.raw == theirs.raw, (
                    f"p{partition}: broker {node} and broker 1 differ at offset {mine.base_offset}: "
                    f"({mine.base_offset}..{mine.last_offset}, crc {mine.crc:#010x}, epoch {mine.leader_epoch}) vs "
                    f"({theirs.base_offset}..{theirs.last_offset}, crc {theirs.crc:#010x}, epoch {theirs.leader_epoch})"
                )
        stored = {offset: value for batch in reference for offset, value in batch.records}
        assert len(stored) == hw, f"p{partition}: {len(stored)} records stored below HW {hw}"
        wrong = [(o, v, stored.get(o)) for (p, o), v in acked_at.items() if p == partition and stored.get(o) != v]
        assert not wrong, f"p{partition}: {len(wrong)} acknowledged records differ on disk, first {wrong[:3]}"
        epochs_on_disk = sorted({b.leader_epoch for b in reference})
        print(f"p{partition}: {len(reference)} batches, {hw} records, leader epochs on disk {epochs_on_disk}")
    print(f"{summary}; {duplicates} duplicate values (retries), {time.monotonic() - started:.0f}s")
