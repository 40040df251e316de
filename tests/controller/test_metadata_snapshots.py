"""When a controller node snapshots its committed metadata (metadata.log.max.record.bytes.between.snapshots,
metadata.log.max.snapshot.interval.ms), and how the controller and a restarted node load the latest snapshot then
the log after it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

from controller_helpers import SingleVoterMetadataLog, new_controller, single_voter

from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.metadata_log import MetadataSnapshot, decode_metadata_batches, read_metadata_snapshot
from tierlog.controller.metadata_snapshots import MetadataSnapshotter, SnapshotConfig
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import MetadataRecord, ProducerIdsRecord, TopicRecord, encode_record
from tierlog.raft.raft_client import RaftClient

NOW = 1_700_000_000_000


def _append(client: RaftClient, records: Sequence[MetadataRecord], now_ms: int = NOW) -> None:
    client.append([encode_record(record) for record in records], now_ms)


def _replayed(client: RaftClient) -> ClusterMetadata:
    """The image of the node's whole committed state: its latest snapshot, then its log."""
    snapshot = read_metadata_snapshot(client.log)
    image = (
        ClusterMetadata() if snapshot is None else ClusterMetadata.from_snapshot(snapshot.records, snapshot.end_offset)
    )
    high_watermark = client.high_watermark or 0
    for offset, record in decode_metadata_batches(client.read_committed(client.log.start_offset, 1 << 30)).records:
        if offset < high_watermark:
            image.apply(offset, record)
    return image


def test_a_snapshot_is_written_once_enough_record_bytes_are_committed(tmp_path: Path) -> None:
    client = single_voter(tmp_path)
    snapshotter = MetadataSnapshotter(client, SnapshotConfig(max_bytes_between_snapshots=400), NOW)
    _append(client, [ProducerIdsRecord(1, 1000)])
    assert snapshotter.poll(NOW) is None
    assert client.log.snapshots.ids == []
    for n in range(2, 6):
        _append(client, [ProducerIdsRecord(1, 1000 * n)])
    snapshot_id = snapshotter.poll(NOW)
    assert snapshot_id is not None and snapshot_id.offset == client.high_watermark
    assert client.log.start_offset == snapshot_id.offset
    assert snapshotter.image.next_producer_id == 5000
    assert _replayed(client) == snapshotter.image
    # The count starts again from the snapshot.
    _append(client, [ProducerIdsRecord(1, 6000)])
    assert snapshotter.poll(NOW) is None


def test_a_snapshot_is_written_when_committed_records_are_older_than_the_interval(tmp_path: Path) -> None:
    client = single_voter(tmp_path)
    snapshotter = MetadataSnapshotter(client, SnapshotConfig(max_interval_ms=1000), NOW)
    _append(client, [ProducerIdsRecord(1, 1000)])
    assert snapshotter.poll(NOW + 999) is None
    assert snapshotter.poll(NOW + 1000) is not None
    # Nothing committed since: no new snapshot, however long it waits.
    assert snapshotter.poll(NOW + 10_000) is None
    _append(client, [ProducerIdsRecord(1, 2000)])
    assert snapshotter.poll(NOW + 10_000) is not None


def test_an_interval_of_zero_disables_time_based_snapshots(tmp_path: Path) -> None:
    client = single_voter(tmp_path)
    snapshotter = MetadataSnapshotter(client, SnapshotConfig(max_interval_ms=0), NOW)
    _append(client, [ProducerIdsRecord(1, 1000)])
    assert snapshotter.poll(NOW + 10**9) is None


def test_a_restarted_node_loads_its_latest_snapshot_then_the_log_after_it(tmp_path: Path) -> None:
    client = single_voter(tmp_path)
    snapshotter = MetadataSnapshotter(client, SnapshotConfig(max_bytes_between_snapshots=1), NOW)
    topic_id = uuid.UUID(int=9)
    _append(client, [TopicRecord("events", topic_id), ProducerIdsRecord(1, 1000)])
    snapshot_id = snapshotter.poll(NOW)
    assert snapshot_id is not None
    _append(client, [ProducerIdsRecord(1, 2000)])
    client.log.close()

    restarted = single_voter(tmp_path, NOW + 1)
    assert restarted.log.start_offset == snapshot_id.offset
    reloaded = MetadataSnapshotter(restarted, SnapshotConfig(), NOW + 1)
    assert reloaded.image.offset == snapshot_id.offset - 1
    assert "events" in reloaded.image.topics
    reloaded.poll(NOW + 1)
    assert reloaded.image.next_producer_id == 2000
    assert reloaded.image == _replayed(restarted)


class _SnapshotThenLog(SingleVoterMetadataLog):
    """A metadata log that starts at a snapshot: reading below it would be a bug."""

    def __init__(self, directory: Path, snapshot: MetadataSnapshot) -> None:
        super().__init__(directory)
        self._snapshot = snapshot

    def latest_snapshot(self) -> MetadataSnapshot | None:
        return self._snapshot

    def records_from(self, start_offset: int) -> list[tuple[int, MetadataRecord]]:
        assert start_offset >= self._snapshot.end_offset, f"read from {start_offset}, below the snapshot"
        return super().records_from(start_offset)


def test_the_controller_is_built_from_the_latest_snapshot_then_the_log_after_it(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    snapshot = MetadataSnapshot(controller.metadata.snapshot_records(), controller.metadata.offset + 1)
    controller.create_topic("after-the-snapshot", 2, 2, {"retention.ms": "1000"})
    controller.allocate_producer_id_block(1)
    broker = controller.metadata.brokers[2]
    controller.heartbeat(2, broker.broker_epoch, controller.metadata.offset, True, False, 0)
    expected = controller.metadata
    controller.metadata_log.close()

    rebuilt = Controller(_SnapshotThenLog(tmp_path, snapshot), ControllerConfig(), 0)
    assert rebuilt.metadata == expected
    assert rebuilt.metadata.brokers[2].fenced
    assert "after-the-snapshot" in rebuilt.metadata.topics
