"""Producer snapshots and the remote tier (KIP-405): every copied segment takes along the producer snapshot
taken at its end, and a follower that rebuilds its state from the remote tier (BuildingRemoteLogAuxState)
loads that snapshot, so once it leads it still recognises an idempotent producer's retry and its gaps.

Each topic lives on brokers 2 and 3 (2 the preferred leader) of a three-broker cluster; node 1 is the
controller and holds no replica. Closed segments leave the leader's disk as soon as they are copied.
"""

from __future__ import annotations

import time
from pathlib import Path

from cluster_helpers import replica_state, send_request
from tiered_helpers import (
    create_topic,
    leader_of,
    lose_replica_disk,
    produce,
    record_values,
    tiered_topic_configs,
    wait_in_sync,
    wait_tiered,
)

from tierlog.client.requests import produce_request
from tierlog.common import TopicPartition
from tierlog.protocol.errors import error_code
from tierlog.records.codec import build_batch
from tierlog.storage.producer_state import decode_snapshot
from tierlog.testing.local_cluster import LocalCluster

LEADER, FOLLOWER = 2, 3
PRODUCER_ID, PRODUCER_EPOCH = 777_000, 3
# Idempotent batches of this many records: enough of them to fill a few segments.
BATCH_RECORDS = 20


def idempotent_batch(sequence: int) -> bytes:
    now = int(time.time() * 1000)
    return build_batch(
        [(None, b"idempotent-%06d-" % (sequence + i) + b"v" * 100, [], now) for i in range(BATCH_RECORDS)],
        producer_id=PRODUCER_ID,
        producer_epoch=PRODUCER_EPOCH,
        base_sequence=sequence,
    )


def raw_produce(cluster: LocalCluster, node_id: int, topic: str, records: bytes) -> tuple[int, int]:
    """(error code, base offset) of an acks=all Produce v9 sent straight to broker `node_id`."""
    request = produce_request(TopicPartition(topic, 0), records, acks=-1, timeout_ms=10_000)
    answer = send_request(cluster.broker(node_id).bootstrap, request, timeout_s=15).responses[0].partition_responses[0]
    return int(answer.error_code.value), int(answer.base_offset)


def remote_objects(remote_dir: Path, topic: str) -> list[Path]:
    return sorted(p for p in remote_dir.rglob("*") if p.is_file() and p.parent.name.startswith(topic))


def test_every_copied_segment_has_the_producer_snapshot_of_its_end_next_to_it(
    file_tiered_cluster: LocalCluster, remote_dir: Path
) -> None:
    cluster = file_tiered_cluster
    topic = "snapshots"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), assignment=[[LEADER, FOLLOWER]])
    written = []
    for batch_number in range(40):
        error, base_offset = raw_produce(cluster, LEADER, topic, idempotent_batch(batch_number * BATCH_RECORDS))
        assert error == error_code(None).value, f"batch {batch_number}: error {error}"
        written.append(base_offset)
    # Everything but the active segment (a few hundred records) is copied and gone locally.
    wait_tiered(cluster, LEADER, topic, local_start_above=written[-1] - 10 * BATCH_RECORDS)
    segments = sorted((p for p in remote_objects(remote_dir, topic) if p.suffix == ".log"), key=lambda p: p.name)
    assert len(segments) >= 2
    starts = [int(p.name.split("-")[0]) for p in segments]
    for index, segment in enumerate(segments):
        snapshot = segment.with_suffix(".snapshot")
        assert snapshot.exists(), f"{segment.name} was copied without its producer snapshot"
        (entry,) = decode_snapshot(snapshot.read_bytes())
        assert (entry.producer_id, entry.producer_epoch) == (PRODUCER_ID, PRODUCER_EPOCH)
        # One producer wrote every record from sequence 0: sequences are offsets.
        assert entry.last_seq == entry.last_data_offset and (entry.last_data_offset + 1) % BATCH_RECORDS == 0
        if index + 1 < len(segments):
            # The state as of the segment's end: its last batch is the segment's last batch.
            assert entry.last_data_offset == starts[index + 1] - 1


def test_a_follower_rebuilt_from_the_remote_tier_deduplicates_a_retry_once_it_leads(
    file_tiered_cluster: LocalCluster,
) -> None:
    cluster = file_tiered_cluster
    topic = "rebuilt-producer-state"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), assignment=[[LEADER, FOLLOWER]])
    lose_replica_disk(cluster, FOLLOWER, topic)
    batches = 10
    offsets = []
    for batch_number in range(batches):
        error, base_offset = raw_produce(cluster, LEADER, topic, idempotent_batch(batch_number * BATCH_RECORDS))
        assert error == error_code(None).value
        offsets.append(base_offset)
    last_sequence = (batches - 1) * BATCH_RECORDS
    # Other producers' data pushes the idempotent producer's batches into the remote tier only.
    produce(cluster.bootstrap, topic, record_values("filler", 1500))
    wait_tiered(cluster, LEADER, topic, local_start_above=offsets[-1] + BATCH_RECORDS)

    cluster.restart(FOLLOWER)

    follower_state = wait_in_sync(cluster, topic, LEADER, FOLLOWER)
    assert follower_state["local_log_start_offset"] > offsets[-1]

    cluster.kill(LEADER)
    assert leader_of(cluster, topic) == FOLLOWER
    end = replica_state(cluster, FOLLOWER, topic)["log_end_offset"]  # type: ignore[index]
    # The retry of the producer's last batch is answered with where it was written, and not stored again ...
    assert raw_produce(cluster, FOLLOWER, topic, idempotent_batch(last_sequence)) == (0, offsets[-1])
    assert replica_state(cluster, FOLLOWER, topic)["log_end_offset"] == end  # type: ignore[index]
    # ... a gap is refused (a producer the broker knew nothing of could start anywhere) ...
    error, _ = raw_produce(cluster, FOLLOWER, topic, idempotent_batch(last_sequence + 3 * BATCH_RECORDS))
    assert error == error_code("OUT_OF_ORDER_SEQUENCE_NUMBER").value
    # ... and the next batch in sequence goes on at the log end.
    assert raw_produce(cluster, FOLLOWER, topic, idempotent_batch(last_sequence + BATCH_RECORDS)) == (0, end)
