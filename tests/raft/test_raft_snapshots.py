"""Snapshots in the Raft core (docs/quorum.md#snapshots): a replica snapshots its committed state and its log then
starts there; a voter or a broker whose fetch offset is gone from the leader's log fetches the leader's snapshot
with FetchSnapshot, installs it and fetches on; a restarted replica starts from its latest snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
from quorum_harness import Quorum

from tierlog.controller.metadata_snapshots import MetadataSnapshotter, SnapshotConfig
from tierlog.metadata.records import ProducerIdsRecord, encode_record
from tierlog.raft.messages import (
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    OffsetAndEpoch,
    RaftFetchRequest,
    RaftFetchResponse,
)
from tierlog.raft.raft_client import RaftClient
from tierlog.raft.raft_log import RaftLog
from tierlog.raft.snapshot import SnapshotStore, parse_snapshot
from tierlog.records.codec import decode_batches

BROKER_ID = 100


def _values(data: bytes) -> list[bytes]:
    """The data records' values (control batches, the LeaderChangeMessages, left out)."""
    return [r.value for b in decode_batches(data) if not b.header.is_control for r in b.records if r.value is not None]


def _state(client: RaftClient) -> list[bytes]:
    """Everything committed on `client`: its latest snapshot's values, then the committed records after it."""
    snapshot = client.log.latest_snapshot()
    before = [] if snapshot is None else snapshot.values
    return before + _values(client.read_committed(client.log.start_offset, 1 << 30))


def _snapshot(client: RaftClient, now_ms: int) -> OffsetAndEpoch:
    """Snapshot everything `client` has committed (the state is simply the list of values)."""
    high_watermark = client.high_watermark
    assert high_watermark is not None
    snapshot_id = OffsetAndEpoch(high_watermark, client.log.epoch_of_offset_before(high_watermark))
    assert client.create_snapshot(snapshot_id, _state(client), now_ms, now_ms)
    return snapshot_id


def _caught_up(quorum: Quorum, node: int, leader: RaftClient) -> bool:
    client = quorum.nodes[node]
    return client is not None and client.high_watermark == leader.log.end_offset


def test_a_snapshot_moves_the_log_start_to_its_end_offset_and_keeps_the_state(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1])
    leader = quorum.client(1)
    for n in range(20):
        quorum.append(b"v%d" % n)
    before = _state(leader)
    snapshot_id = _snapshot(leader, quorum.now)
    assert leader.log.start_offset == snapshot_id.offset == leader.log.end_offset
    assert leader.log.snapshots.ids == [snapshot_id]
    assert _state(leader) == before
    quorum.append(b"after")
    assert _state(leader) == [*before, b"after"]


def test_a_snapshot_past_the_high_watermark_is_refused(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    for follower in {1, 2, 3} - {leader.node_id}:
        quorum.isolate(follower)
    quorum.append(b"not committed")
    end = leader.log.end_offset
    with pytest.raises(ValueError, match=r"past the high watermark"):
        leader.create_snapshot(OffsetAndEpoch(end, leader.epoch), [], 0, quorum.now)


def test_a_lagging_voter_catches_up_by_fetching_the_leaders_snapshot(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    lagging = next(n for n in (1, 2, 3) if n != leader.node_id)
    quorum.append(b"seen by all")
    quorum.run_until(lambda: _caught_up(quorum, lagging, leader))
    quorum.kill(lagging)
    for n in range(50):
        quorum.append(b"missed-%d" % n)
    quorum.run_for(20)
    snapshot_id = _snapshot(leader, quorum.now)
    quorum.append(b"after the snapshot")
    assert leader.log.start_offset == snapshot_id.offset

    restarted = quorum.start(lagging)
    quorum.run_until(lambda: _caught_up(quorum, lagging, leader))
    # It holds the leader's snapshot, byte for byte, and its log starts there.
    assert restarted.log.snapshots.ids == [snapshot_id]
    assert restarted.log.snapshots.path(snapshot_id).read_bytes() == leader.log.snapshots.path(snapshot_id).read_bytes()
    assert restarted.log.start_offset == snapshot_id.offset
    assert _state(restarted) == _state(leader)
    assert _state(restarted)[-1] == b"after the snapshot"
    # And it keeps replicating.
    quorum.append(b"later")
    quorum.run_until(lambda: _caught_up(quorum, lagging, leader))
    assert _state(restarted) == _state(leader)


def test_a_voter_that_lost_its_disk_is_rebuilt_from_the_snapshot_and_the_log(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    for n in range(10):
        quorum.append(b"v%d" % n)
    wiped = next(n for n in (1, 2, 3) if n != leader.node_id)
    quorum.run_until(lambda: _caught_up(quorum, wiped, leader))
    _snapshot(leader, quorum.now)
    quorum.wipe(wiped)
    rebuilt = quorum.start(wiped)
    quorum.run_until(lambda: _caught_up(quorum, wiped, leader))
    assert _state(rebuilt) == _state(leader) == [b"v%d" % n for n in range(10)]


def test_a_restarted_voter_starts_from_its_latest_snapshot_then_its_log(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1])
    for n in range(5):
        quorum.append(b"old-%d" % n)
    snapshot_id = _snapshot(quorum.client(1), quorum.now)
    quorum.append(b"new")
    quorum.run_for(5)
    quorum.kill(1)
    restarted = quorum.start(1)
    assert restarted.log.start_offset == snapshot_id.offset
    assert restarted.log.last_epoch >= snapshot_id.epoch
    quorum.run_until(lambda: restarted.is_active_leader())
    assert _state(restarted) == [*(b"old-%d" % n for n in range(5)), b"new"]


def test_a_new_broker_loads_the_snapshot_then_fetches_the_log_after_it(tmp_path: Path) -> None:
    """An observer fetching from offset 0 is told the snapshot; FetchSnapshot hands it over in chunks (cut
    anywhere); then it fetches from the snapshot's end offset."""
    quorum = Quorum(tmp_path, [1])
    leader = quorum.client(1)
    for n in range(30):
        quorum.append(b"record-%d" % n)
    snapshot_id = _snapshot(leader, quorum.now)
    quorum.append(b"after")

    answers: list[RaftFetchResponse] = []
    fetch = RaftFetchRequest(BROKER_ID, leader.epoch, fetch_offset=0, last_fetched_epoch=-1, max_wait_ms=0)
    leader.handle_fetch(fetch, quorum.now, answers.append)
    assert answers[-1].snapshot_id == snapshot_id and answers[-1].records == b""
    assert answers[-1].log_start_offset == snapshot_id.offset

    data = b""
    while True:
        chunk = leader.handle_fetch_snapshot(
            FetchSnapshotRequest(BROKER_ID, leader.epoch, snapshot_id, position=len(data), max_bytes=100), quorum.now
        )
        assert chunk.error is None and chunk.position == len(data)
        data += chunk.data
        if len(data) == chunk.size:
            break
    assert parse_snapshot(snapshot_id, data).values == [b"record-%d" % n for n in range(30)]

    after = RaftFetchRequest(BROKER_ID, leader.epoch, snapshot_id.offset, -1, max_wait_ms=0)
    leader.handle_fetch(after, quorum.now, answers.append)
    assert answers[-1].snapshot_id is None and _values(answers[-1].records) == [b"after"]


def test_fetch_snapshot_errors_are_kafkas(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1])
    leader = quorum.client(1)
    quorum.append(b"a")
    snapshot_id = _snapshot(leader, quorum.now)
    unknown = OffsetAndEpoch(snapshot_id.offset + 5, snapshot_id.epoch)
    request = FetchSnapshotRequest(BROKER_ID, leader.epoch, unknown, position=0)
    assert leader.handle_fetch_snapshot(request, quorum.now).error == "SNAPSHOT_NOT_FOUND"
    size = leader.log.snapshots.size(snapshot_id)
    request = FetchSnapshotRequest(BROKER_ID, leader.epoch, snapshot_id, position=size)
    assert leader.handle_fetch_snapshot(request, quorum.now).error == "POSITION_OUT_OF_RANGE"
    request = FetchSnapshotRequest(BROKER_ID, leader.epoch + 1, snapshot_id, position=0)
    assert leader.handle_fetch_snapshot(request, quorum.now).error == "UNKNOWN_LEADER_EPOCH"


def test_a_fetch_at_the_log_start_with_another_epoch_than_the_snapshots_gets_the_snapshot(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1])
    leader = quorum.client(1)
    quorum.append(b"a")
    snapshot_id = _snapshot(leader, quorum.now)
    log = leader.log
    assert log.snapshot_to_fetch(snapshot_id.offset, snapshot_id.epoch) is None
    assert log.snapshot_to_fetch(snapshot_id.offset, snapshot_id.epoch + 1) == snapshot_id
    assert log.snapshot_to_fetch(snapshot_id.offset - 1, snapshot_id.epoch) == snapshot_id
    assert log.snapshot_to_fetch(log.end_offset, snapshot_id.epoch - 1) == snapshot_id


def test_a_log_behind_its_latest_snapshot_is_truncated_to_start_there_at_open(tmp_path: Path) -> None:
    """A follower that crashed after fetching a snapshot but before truncating its log (Kafka's
    truncateToLatestSnapshot): the next open starts the log at the snapshot."""
    log = RaftLog(tmp_path, 0)
    log.append_values([b"a", b"b"], epoch=1, now_ms=0)
    directory = log.snapshots.directory
    log.close()
    fetched = OffsetAndEpoch(10, 2)
    SnapshotStore(directory).write(fetched, [b"state"], 0, 0)
    reopened = RaftLog(tmp_path, 0)
    assert (reopened.start_offset, reopened.end_offset, reopened.last_epoch) == (10, 10, 2)
    assert reopened.epoch_of_offset_before(10) == 2
    latest = reopened.latest_snapshot()
    assert latest is not None and latest.values == [b"state"]


def test_a_voter_that_installed_the_leaders_snapshot_folds_its_metadata_from_there(tmp_path: Path) -> None:
    """Each voter snapshots its own committed metadata (MetadataSnapshotter); one that was too far behind takes
    the leader's snapshot instead and carries on from it."""
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    lagging = next(n for n in (1, 2, 3) if n != leader.node_id)
    quorum.kill(lagging)
    leader_snapshotter = MetadataSnapshotter(leader, SnapshotConfig(max_bytes_between_snapshots=1), quorum.now)
    for n in range(1, 6):
        quorum.append(encode_record(ProducerIdsRecord(1, 1000 * n)))
    quorum.run_for(10)
    snapshot_id = leader_snapshotter.poll(quorum.now)
    assert snapshot_id is not None
    quorum.append(encode_record(ProducerIdsRecord(1, 6000)))

    restarted = quorum.start(lagging)
    snapshotter = MetadataSnapshotter(restarted, SnapshotConfig(), quorum.now)
    quorum.run_until(lambda: _caught_up(quorum, lagging, leader))
    snapshotter.poll(quorum.now)
    leader_snapshotter.poll(quorum.now)
    assert restarted.log.start_offset == snapshot_id.offset
    assert snapshotter.image.next_producer_id == 6000
    assert snapshotter.image == leader_snapshotter.image


def test_a_download_whose_snapshot_the_leader_replaced_starts_over_with_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader snapshots again while a follower is between two chunks of its previous snapshot: the next chunk
    is answered SNAPSHOT_NOT_FOUND, the follower gives up the `.part` and fetches, which names the new one."""
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    lagging = next(n for n in (1, 2, 3) if n != leader.node_id)
    quorum.kill(lagging)
    # More than one FetchSnapshot chunk (8 MiB each).
    for n in range(9):
        quorum.append(bytes([n]) * (1024 * 1024))
    quorum.run_for(10)
    first = _snapshot(leader, quorum.now)
    quorum.append(b"one more")
    quorum.run_until(lambda: (leader.high_watermark or 0) == leader.log.end_offset)
    replaced: list[OffsetAndEpoch] = []
    serve = leader.handle_fetch_snapshot

    def snapshot_again_before_the_second_chunk(request: FetchSnapshotRequest, now_ms: int) -> FetchSnapshotResponse:
        if request.position > 0 and not replaced:
            replaced.append(_snapshot(leader, now_ms))
        return serve(request, now_ms)

    monkeypatch.setattr(leader, "handle_fetch_snapshot", snapshot_again_before_the_second_chunk)
    restarted = quorum.start(lagging)
    took = quorum.run_until(lambda: _caught_up(quorum, lagging, leader))
    # At once, not after a fetch timeout and an election round.
    assert took < quorum.config.fetch_timeout_ms
    assert restarted.state_name == "follower" and restarted.epoch == leader.epoch
    assert replaced and replaced[0] != first
    assert restarted.log.snapshots.ids == replaced == leader.log.snapshots.ids
    assert not any(p.name.endswith(".part") for p in restarted.log.snapshots.directory.iterdir())
    assert _state(restarted) == _state(leader)


def test_a_snapshot_inside_a_batch_is_refused(tmp_path: Path) -> None:
    """The log would then start inside a batch, and a fetch from its start would get records before it."""
    log = RaftLog(tmp_path, 0)
    log.append_values([b"a", b"b", b"c"], epoch=1, now_ms=0)
    with pytest.raises(ValueError, match=r"ends inside a batch"):
        log.create_snapshot(OffsetAndEpoch(2, 1), [b"state"], 0, high_watermark=3, now_ms=0)
    assert log.create_snapshot(OffsetAndEpoch(3, 1), [b"state"], 0, high_watermark=3, now_ms=0)
    assert log.start_offset == 3


def test_segments_wholly_below_the_snapshot_are_deleted_and_the_one_holding_its_offset_is_kept(
    tmp_path: Path,
) -> None:
    log = RaftLog(tmp_path, 0)
    for values in ([b"a"] * 5, [b"b"] * 5, [b"c"] * 5):
        log.append_values(values, epoch=1, now_ms=0)
        # Segments roll at 1 GiB; roll the storage log by hand to get three.
        log._log.roll(0)
    log.append_values([b"d"], epoch=1, now_ms=0)
    directory = log.snapshots.directory
    assert sorted(p.name for p in directory.glob("*.log")) == [f"{n:020d}.log" for n in (0, 5, 10, 15)]
    assert log.create_snapshot(OffsetAndEpoch(10, 1), [b"state"], 0, high_watermark=16, now_ms=0)
    assert sorted(p.name for p in directory.glob("*.log")) == [f"{n:020d}.log" for n in (10, 15)]
    log.close()
    reopened = RaftLog(tmp_path, 0)
    assert (reopened.start_offset, reopened.end_offset) == (10, 16)
    assert _values(reopened.read(10, 1 << 20)) == [b"c"] * 5  # a read stops at the end of a segment
