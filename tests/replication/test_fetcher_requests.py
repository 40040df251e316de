"""The follower's fetcher as a state machine: `poll` names the next request to a leader (or to the remote tier), one
at a time, and the answers move it on; the asyncio shell and the simulator only carry them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from replication_helpers import NOW, TP, Cluster

from tierlog.common import Idle, TopicPartition
from tierlog.replication.fetcher import (
    BUILDING_REMOTE_LOG_AUX_STATE,
    FETCHING,
    IDLE_POLL_MS,
    LEADER_LOCAL_LOG_START,
    LEADER_LOG_RANGE,
    EpochEndOffsetRequest,
    FetchRequestData,
    FetchResponsePartition,
    ListOffsetsRequest,
    RemoteLogAuxStateRequest,
    ReplicaFetcher,
)


def follower_fetcher(tmp_path: Path) -> ReplicaFetcher:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    return cluster.managers[2].fetchers[1]


def answer_fetch_with(fetcher: ReplicaFetcher, error: str) -> None:
    assert isinstance(fetcher.poll(NOW), FetchRequestData)
    fetcher.process_fetch_response([FetchResponsePartition(TP, error, -1, -1, None, None)], NOW)


def test_an_out_of_range_partition_asks_for_the_leaders_log_range_before_it_fetches_again(tmp_path: Path) -> None:
    fetcher = follower_fetcher(tmp_path)
    answer_fetch_with(fetcher, "OFFSET_OUT_OF_RANGE")
    assert fetcher.poll(NOW) == ListOffsetsRequest(TP, LEADER_LOG_RANGE)
    fetcher.on_list_offsets(TP, [(0, 0), (0, 0)], NOW)
    request = fetcher.poll(NOW)
    assert isinstance(request, FetchRequestData) and request.partitions[0].fetch_offset == 0


def test_a_refused_list_offsets_backs_only_its_partition_off(tmp_path: Path) -> None:
    fetcher = follower_fetcher(tmp_path)
    # A second partition from the same leader (its fetch state and log borrowed from the first).
    other = TopicPartition(TP.topic, 1)
    fetcher.partitions[other] = dataclasses.replace(fetcher.partitions[TP])
    partition_of = fetcher._partition_of
    fetcher._partition_of = lambda tp: partition_of(TP)
    answer_fetch_with(fetcher, "OFFSET_OUT_OF_RANGE")
    fetcher.on_list_offsets_failed(TP, "NOT_LEADER_OR_FOLLOWER", NOW)
    assert fetcher.partitions[TP].delayed_until_ms == NOW + fetcher.config.backoff_ms
    # The leader's other partitions fetch on.
    request = fetcher.poll(NOW)
    assert isinstance(request, FetchRequestData)
    assert [p.topic_partition for p in request.partitions] == [other]


def test_with_nothing_to_fetch_the_fetcher_idles_until_a_backoff_ends_or_briefly(tmp_path: Path) -> None:
    fetcher = follower_fetcher(tmp_path)
    fetcher.on_fetch_failed(NOW)
    assert fetcher.poll(NOW) == Idle(NOW + min(IDLE_POLL_MS, fetcher.config.backoff_ms))
    fetcher.remove_partition(TP)
    assert fetcher.poll(NOW) == Idle(NOW + IDLE_POLL_MS)


@pytest.mark.parametrize(
    ("answer", "target_epoch"),
    [
        # The leader's local log starts at L = 10 in epoch 3; epoch 2 has no records, epoch 1 ends at 10: 9 is in 1.
        ((1, 10), 1),
        # Epoch 2 ends at 9, before L - 1 = 9 could be in it: 9 is in epoch 3 (its first offset).
        ((2, 9), 3),
    ],
)
def test_building_remote_log_aux_state_finds_the_epoch_holding_the_offset_before_the_leaders_local_start(
    tmp_path: Path, answer: tuple[int, int], target_epoch: int
) -> None:
    fetcher = follower_fetcher(tmp_path)
    answer_fetch_with(fetcher, "OFFSET_MOVED_TO_TIERED_STORAGE")
    assert fetcher.poll(NOW) == ListOffsetsRequest(TP, LEADER_LOCAL_LOG_START)
    fetcher.on_list_offsets(TP, [(10, 3), (4, 1)], NOW)
    assert fetcher.poll(NOW) == EpochEndOffsetRequest(TP, 2)
    fetcher.on_epoch_end_offset(TP, *answer, NOW)
    assert fetcher.poll(NOW) == RemoteLogAuxStateRequest(TP, target_epoch, 9)


def test_a_leader_local_log_starting_in_epoch_0_needs_no_epoch_lookup(tmp_path: Path) -> None:
    fetcher = follower_fetcher(tmp_path)
    answer_fetch_with(fetcher, "OFFSET_MOVED_TO_TIERED_STORAGE")
    fetcher.poll(NOW)
    fetcher.on_list_offsets(TP, [(10, 0), (0, 0)], NOW)
    assert fetcher.poll(NOW) == RemoteLogAuxStateRequest(TP, 0, 9)


def test_the_remote_segment_restarts_the_follower_log_after_its_end_with_the_leaders_history(tmp_path: Path) -> None:
    fetcher = follower_fetcher(tmp_path)
    answer_fetch_with(fetcher, "OFFSET_MOVED_TO_TIERED_STORAGE")
    fetcher.poll(NOW)
    fetcher.on_list_offsets(TP, [(10, 0), (4, 0)], NOW)
    fetcher.poll(NOW)
    fetcher.on_remote_log_aux_state(TP, 11, [(0, 0)], None, NOW)
    state = fetcher.partitions[TP]
    assert (state.state, state.fetch_offset, state.last_fetched_epoch) == (FETCHING, 12, 0)
    request = fetcher.poll(NOW)
    assert isinstance(request, FetchRequestData)
    assert (request.partitions[0].fetch_offset, request.partitions[0].log_start_offset) == (12, 4)


def test_a_failed_build_starts_over_after_the_backoff(tmp_path: Path) -> None:
    fetcher = follower_fetcher(tmp_path)
    answer_fetch_with(fetcher, "OFFSET_MOVED_TO_TIERED_STORAGE")
    fetcher.poll(NOW)
    fetcher.on_list_offsets(TP, [(10, 3), (4, 1)], NOW)
    fetcher.on_epoch_end_offset_failed(TP, "NOT_LEADER_OR_FOLLOWER", NOW)
    backoff_end = NOW + fetcher.config.backoff_ms
    assert fetcher.partitions[TP].state == BUILDING_REMOTE_LOG_AUX_STATE
    assert fetcher.poll(NOW) == Idle(NOW + min(IDLE_POLL_MS, fetcher.config.backoff_ms))
    assert fetcher.poll(backoff_end) == ListOffsetsRequest(TP, LEADER_LOCAL_LOG_START)


def test_a_partition_backed_off_asks_for_the_leaders_log_range_only_after_its_backoff(tmp_path: Path) -> None:
    fetcher = follower_fetcher(tmp_path)
    answer_fetch_with(fetcher, "OFFSET_OUT_OF_RANGE")
    fetcher.on_fetch_failed(NOW)
    assert isinstance(fetcher.poll(NOW), Idle)
    assert fetcher.poll(NOW + fetcher.config.backoff_ms) == ListOffsetsRequest(TP, LEADER_LOG_RANGE)
