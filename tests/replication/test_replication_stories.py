"""The stories of docs/replication.md, replayed step by step between a leader and a follower over real logs:
the two-round HW propagation (story-two-fetch-rounds) and the two failures that truncating to the HW allowed
and leader epochs prevent (story-hw-data-loss, story-divergence), plus truncation across several epochs
(#truncation, #fetch-start)."""

from __future__ import annotations

from pathlib import Path

from replication_helpers import NOW, TOPIC_ID, TP, Cluster, batch, caught_up_pair

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch, decode_batches
from tierlog.replication.fetcher import (
    LEADER_LOG_RANGE,
    FetchRequestData,
    FetchResponsePartition,
    ListOffsetsRequest,
)
from tierlog.replication.trace import FETCH_RESPONSE, PRODUCE, TRUNCATE, fetch_from
from tierlog.storage.log import Log


def values(log: Log) -> list[tuple[int, int, bytes | None]]:
    """(offset, leader epoch, value) of every record in the log."""
    return [
        (record.offset, decoded.header.partition_leader_epoch, record.value)
        for decoded in decode_batches(log_bytes(log))
        for record in decoded.records
    ]


def log_bytes(log: Log) -> bytes:
    return b"".join(segment.log_path.read_bytes() for segment in log.segments)


def test_seed_000_two_round_hw_propagation(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    cluster.fetch(2)  # the follower is already fetching at offset 0, with nothing to get
    cluster.events.clear()

    parked = cluster.send_fetch(2)
    assert not parked.answered  # no data: the FETCH waits in the leader's purgatory
    produced, delayed = cluster.produce(1, b"m1", acks=-1)
    assert parked.answered  # the PRODUCE woke it
    assert produced == [] and delayed is not None  # acks=all waits for the HW
    parked.deliver()
    assert (cluster.log(1).high_watermark, cluster.log(2).high_watermark) == (0, 0)

    cluster.fetch(2)  # second round: fetch offset 1 moves the remote LEO, then both HWs

    assert cluster.trace() == [
        ("Leader LEO", PRODUCE, 0, 1),
        ("Follower LEO", FETCH_RESPONSE, 0, 1),
        ("Remote LEO (broker 2)", fetch_from(2), 0, 1),
        ("Leader HW", fetch_from(2), 0, 1),
        ("Follower HW", FETCH_RESPONSE, 0, 1),
    ]
    whys = [e.why for e in cluster.events]
    assert whys[2] == "fetch offset 1"
    assert whys[3] == "min(Leader LEO=1, Remote LEO (broker 2)=1)=1"
    assert whys[4] == "min(Leader HW=1, Follower LEO=1)=1"
    assert {e.broker_id for e in cluster.events if e.attribute.startswith("Follower")} == {2}
    assert produced[0][TP].error is None


def test_seed_002_hw_data_loss_story_cannot_lose_the_acknowledged_message(tmp_path: Path) -> None:
    # B (1) leads, A (2) follows; m1 is committed everywhere.
    cluster = caught_up_pair(tmp_path, b"m1")
    # m2: A fetches it (LEO 2, HW still 1), its next fetch moves the leader's HW and acknowledges m2 ...
    produced, _ = cluster.produce(1, b"m2", acks=-1)
    cluster.fetch(2)
    in_flight = cluster.send_fetch(2)
    cluster.advance(500)
    assert produced[0][TP].error is None
    assert in_flight.answered and (cluster.log(2).log_end_offset, cluster.log(2).high_watermark) == (2, 1)
    # ... but A restarts before that response brings it HW 2.
    cluster.crash(2)
    cluster.start(2)
    cluster.publish()
    assert cluster.log(2).high_watermark == 1
    assert cluster.log(2).log_end_offset == 2  # restarting never truncates to the stale HW
    # Then B dies and A, still in the ISR, is elected.
    cluster.crash(1)
    cluster.elect(2, [2])
    assert [v for _, _, v in values(cluster.log(2))] == [b"m1", b"m2"]
    assert cluster.log(2).high_watermark == 2
    # B comes back as a follower of A: epoch 0 ended at 2 on A too, so it keeps m2 as well.
    cluster.start(1)
    cluster.publish()
    cluster.fetch(1)
    assert log_bytes(cluster.log(1)) == log_bytes(cluster.log(2))
    assert [v for _, _, v in values(cluster.log(1))] == [b"m1", b"m2"]


def test_seed_002_divergence_story_ends_with_identical_logs(tmp_path: Path) -> None:
    # A (1) leads, B (2) follows; m1 is committed everywhere.
    cluster = caught_up_pair(tmp_path, b"m1")
    # A takes m2 (acks=1) and loses power together with B before B fetched it.
    cluster.produce(1, b"m2", acks=1)
    cluster.crash(1)
    cluster.crash(2)
    # B comes back first and is elected; it takes m3 at offset 1, where A holds m2.
    cluster.start(2)
    cluster.elect(2, [2])
    cluster.produce(2, b"m3", acks=1)
    assert cluster.log(2).high_watermark == 2
    # A comes back as a follower holding m2 at offset 1, where B holds m3.
    cluster.start(1)
    cluster.publish()
    cluster.events.clear()
    responses = cluster.fetch(1)
    assert responses[0].diverging_epoch == (0, 1)
    assert cluster.trace() == [("Follower LEO", TRUNCATE, 2, 1)]
    assert cluster.events[0].why == "diverging epoch 0 ends at 1, ours at 2"
    # The diverging answer did not count as A's position on the leader.
    assert cluster.managers[2].get_partition(TP).remote_replicas[1].log_end_offset == -1
    cluster.fetch(1)
    cluster.fetch(1)
    assert values(cluster.log(1)) == [(0, 0, b"m1"), (1, 1, b"m3")]
    assert log_bytes(cluster.log(1)) == log_bytes(cluster.log(2))
    assert cluster.log(1).high_watermark == cluster.log(2).high_watermark == 2


def _append_as_leader(log: Log, epoch: int, *vals: bytes) -> None:
    log.append_as_leader(batch(*vals), epoch, NOW)


def test_truncation_iterates_over_epochs_the_follower_never_saw(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    now = cluster.now
    leader_log = cluster.managers[1].log_manager.get_or_create_log(TP, TOPIC_ID, {}, now)
    follower_log = cluster.managers[2].log_manager.get_or_create_log(TP, TOPIC_ID, {}, now)
    # Both wrote a0..a2 in epoch 0; then their histories part: the leader has epochs 3 and 5, the follower
    # epochs 2 and 4 (each led while the other was away).
    for log in (leader_log, follower_log):
        _append_as_leader(log, 0, b"a0", b"a1", b"a2")
    _append_as_leader(leader_log, 3, b"b3")
    _append_as_leader(leader_log, 5, b"c4", b"c5")
    _append_as_leader(follower_log, 2, b"x3", b"x4")
    _append_as_leader(follower_log, 4, b"y5", b"y6", b"y7")
    cluster.registration.leader_epoch = 6
    cluster.publish()
    cluster.events.clear()

    # Epoch 4 ended at 4 on the leader, in its epoch 3, which the follower never had: cut back to the end of
    # the follower's own epoch below 3 (epoch 2 ends at 5) and ask again.
    assert cluster.fetch(2)[0].diverging_epoch == (3, 4)
    assert follower_log.log_end_offset == 5 and follower_log.latest_epoch == 2
    # Epoch 2 is unknown to the leader: its epoch 0 ends at 3, as on the follower.
    assert cluster.fetch(2)[0].diverging_epoch == (0, 3)
    assert follower_log.log_end_offset == 3 and follower_log.latest_epoch == 0
    assert cluster.fetch(2)[0].diverging_epoch is None
    assert [e.why for e in cluster.events if e.attribute == "Follower LEO" and e.phase == TRUNCATE] == [
        "diverging epoch 3 ends at 4; ours is unknown, epoch 2 ends at 5",
        "diverging epoch 0 ends at 3, ours at 3",
    ]
    assert [v for _, _, v in values(follower_log)] == [b"a0", b"a1", b"a2", b"b3", b"c4", b"c5"]
    assert log_bytes(follower_log) == log_bytes(leader_log)
    assert [(e.epoch, e.start_offset) for e in follower_log.leader_epoch_cache.epoch_entries()] == [
        (0, 0),
        (3, 3),
        (5, 4),
    ]


def test_follower_without_leader_epochs_truncates_to_its_hw_and_fetches_from_there(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    follower_log = cluster.managers[2].log_manager.get_or_create_log(TP, TOPIC_ID, {}, cluster.now)
    # Batches written before leader epochs existed carry none, so the epoch cache stays empty.
    follower_log.append_as_follower(build_batch([(None, v, [], NOW) for v in (b"a", b"b", b"c")]), NOW)
    follower_log.update_high_watermark(1)
    assert follower_log.latest_epoch is None
    cluster.publish()
    truncations = [(e.attribute, e.old, e.new) for e in cluster.events if e.phase == TRUNCATE]
    assert truncations == [("Follower LEO", 3, 1)]
    fetch_state = cluster.managers[2].fetchers[1].partitions[TP]
    assert (fetch_state.fetch_offset, fetch_state.last_fetched_epoch) == (1, None)
    request = cluster.managers[2].fetchers[1].build_fetch_request(cluster.now)
    assert request is not None
    assert (request.partitions[0].fetch_offset, request.partitions[0].last_fetched_epoch) == (1, -1)


def test_out_of_range_follower_restarts_at_the_leaders_log_start(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1])
    cluster.registration.replicas = [1]
    cluster.publish()
    cluster.produce(1, b"a", b"b", b"c", acks=1)
    cluster.managers[1].delete_records(TP, 2, cluster.now)
    cluster.registration.replicas = [1, 2]
    cluster.registration.partition_epoch += 1
    cluster.publish()
    fetcher = cluster.managers[2].fetchers[1]
    assert cluster.fetch(2)[0].error == "OFFSET_OUT_OF_RANGE"
    assert fetcher.poll(cluster.now) == ListOffsetsRequest(TP, LEADER_LOG_RANGE)
    assert fetcher.build_fetch_request(cluster.now) is None
    fetcher.on_leader_offsets(TP, 2, 3, cluster.now)
    assert isinstance(fetcher.poll(cluster.now), FetchRequestData)
    assert cluster.log(2).log_start_offset == 2
    cluster.fetch(2)
    # The leader's log start lies inside its only batch: the follower takes the batch whole, as Kafka does,
    # and adopts the leader's log start from the response.
    assert log_bytes(cluster.log(2)) == log_bytes(cluster.log(1))
    assert (cluster.log(2).log_start_offset, cluster.log(2).log_end_offset) == (2, 3)


def test_fetch_errors_back_the_partition_off_until_new_metadata(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    fetcher = cluster.managers[2].fetchers[1]
    # The leader moved on to a new epoch the follower has not heard of yet.
    cluster.registration.leader_epoch += 1
    cluster.managers[1].apply_metadata(cluster.image(), cluster.now)
    assert cluster.fetch(2)[0].error == "FENCED_LEADER_EPOCH"
    assert fetcher.build_fetch_request(cluster.now) is None
    assert fetcher.next_wakeup_ms(cluster.now) == cluster.now + fetcher.config.backoff_ms
    cluster.managers[2].apply_metadata(cluster.image(), cluster.now)
    assert cluster.managers[2].fetchers[1].build_fetch_request(cluster.now) is not None
    cluster.managers[2].fetchers[1].on_fetch_failed(cluster.now)
    assert cluster.managers[2].fetchers[1].build_fetch_request(cluster.now) is None


def test_stale_response_for_a_moved_fetch_offset_is_ignored(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    cluster.produce(1, b"a", acks=1)
    in_flight = cluster.send_fetch(2)
    # New metadata re-adds the partition (a new epoch) while the fetch is out.
    cluster.elect(1, [1, 2])
    in_flight.deliver()
    assert cluster.log(2).log_end_offset == 0
    cluster.fetch(2)
    assert cluster.log(2).log_end_offset == 1


def test_response_for_a_partition_not_followed_is_dropped(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2, 3])
    cluster.publish()
    cluster.produce(1, b"a", acks=1)
    in_flight = cluster.send_fetch(2)
    # Leadership moves to broker 3 while broker 1's answer (with records) is on its way back.
    cluster.elect(3, [1, 2, 3])
    assert TP not in in_flight.fetcher.partitions
    in_flight.deliver()
    assert cluster.log(2).log_end_offset == 0
    # A partition this broker does not host at all is dropped too.
    missing = FetchResponsePartition(TopicPartition("other", 0), None, 5, 0, None, b"not a batch")
    in_flight.fetcher.process_fetch_response([missing], cluster.now)


def test_leader_that_cannot_place_our_epoch_sends_the_follower_back_to_its_hw(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    cluster.produce(1, b"a", b"b", acks=1)
    cluster.fetch(2)
    cluster.fetch(2)
    cluster.produce(1, b"c", acks=1)
    cluster.fetch(2)
    assert (cluster.log(2).log_end_offset, cluster.log(2).high_watermark) == (3, 2)
    fetcher = cluster.managers[2].fetchers[1]
    assert fetcher.build_fetch_request(cluster.now) is not None
    cluster.events.clear()
    fetcher.process_fetch_response([FetchResponsePartition(TP, None, 3, 0, (-1, -1), None)], cluster.now)
    # Truncation comes first and the response's HW is not adopted in that round.
    assert cluster.trace() == [("Follower LEO", TRUNCATE, 3, 2)]
    assert cluster.events[0].why == "leader knows no end of epoch 0: truncate to HW 2"
    assert fetcher.partitions[TP].fetch_offset == 2


def test_delete_records_moves_the_log_start_on_the_leader_then_on_the_follower(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    cluster.produce(1, b"a", acks=1)
    cluster.produce(1, b"b", acks=1)
    cluster.fetch(2)
    cluster.fetch(2)
    cluster.events.clear()
    assert cluster.managers[1].delete_records(TP, 1, cluster.now) == 1
    cluster.fetch(2)
    assert cluster.trace() == [("Log start", "DeleteRecords", 0, 1), ("Log start", FETCH_RESPONSE, 0, 1)]
    assert [(e.broker_id, e.why) for e in cluster.events] == [(1, "delete before 1"), (2, "leader's log start 1")]
