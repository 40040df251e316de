"""The Raft core's rules (docs/quorum.md), on real logs and quorum-state files, over the harness's network."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from quorum_harness import Quorum

from tierlog.raft.messages import VoteRequest
from tierlog.raft.quorum_state import FileQuorumStateStore
from tierlog.raft.raft_client import NotLeaderError, RaftClient, RaftConfig
from tierlog.raft.raft_log import RaftLog


def test_a_single_voter_leads_at_once_and_commits_each_append(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1])
    leader = quorum.client(1)
    assert leader.is_active_leader() and leader.epoch == 1
    offset = quorum.append(b"a", b"b")
    assert offset == 1  # the LeaderChangeMessage opened the epoch at offset 0
    assert leader.high_watermark == 3


def test_a_single_voter_stays_the_active_leader_with_nobody_to_hear_from(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1])
    leader = quorum.client(1)
    quorum.run_for(10 * quorum.config.fetch_timeout_ms)
    assert leader.is_active_leader() and leader.epoch == 1


def test_three_voters_elect_one_leader_and_commit_on_a_majority(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    offset = quorum.append(b"x")
    quorum.run_until(lambda: all(quorum.client(n).high_watermark or offset < 0 for n in (1, 2, 3)))
    logs = {n: quorum.committed_on(n) for n in (1, 2, 3)}
    assert len(set(logs.values())) == 1 and logs[1]
    assert {quorum.client(n).epoch for n in (1, 2, 3)} == {leader.epoch}


def test_appends_are_refused_on_followers(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    quorum.wait_for_active_leader()
    follower = next(c for c in quorum.nodes.values() if c is not None and not c.is_leader)
    with pytest.raises(NotLeaderError):
        follower.append([b"no"], quorum.now)


def test_killing_the_leader_elects_another_that_keeps_every_committed_record(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    old = quorum.wait_for_active_leader()
    offset = quorum.append(b"committed")
    quorum.run_until(lambda: (old.high_watermark or 0) > offset)
    committed = old.read_committed(0, 1 << 30)
    quorum.kill(old.node_id)
    took = quorum.run_until(lambda: quorum.active_leader() is not None)
    new = quorum.active_leader()
    assert new is not None and new.node_id != old.node_id and new.epoch > old.epoch
    assert new.read_committed(0, 1 << 30).startswith(committed)
    # Fetch timeout, then a pre-vote and a vote round: a few seconds of virtual time at Kafka's defaults.
    assert took < 2 * (quorum.config.fetch_timeout_ms + 2 * quorum.config.election_timeout_ms)


def test_a_deposed_leader_truncates_its_uncommitted_records_on_the_new_leaders_diverging_epoch(
    tmp_path: Path,
) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    old = quorum.wait_for_active_leader()
    quorum.append(b"committed")
    quorum.run_until(lambda: all((quorum.client(n).high_watermark or 0) == old.log.end_offset for n in (1, 2, 3)))
    quorum.isolate(old.node_id)
    # Written while cut off: on the old leader's disk only, never committed.
    uncommitted_offset = old.append([b"lost-1", b"lost-2"], quorum.now)
    quorum.run_until(
        lambda: any(c is not None and c.is_active_leader() and c is not old for c in quorum.nodes.values())
    )
    new = next(c for c in quorum.nodes.values() if c is not None and c.is_active_leader() and c is not old)
    new.append([b"new-epoch"], quorum.now)
    quorum.heal()
    quorum.run_until(lambda: old.state_name == "follower" and old.high_watermark == new.log.end_offset)
    assert old.log.read(0, 1 << 30) == new.log.read(0, 1 << 30)
    assert b"lost-1" not in old.log.read(0, 1 << 30)
    assert old.log.end_offset_for_epoch(old.log.last_epoch).offset == new.log.end_offset
    assert uncommitted_offset < new.log.end_offset


def test_a_voter_that_lost_its_disk_cannot_vote_itself_into_leadership(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    quorum.append(b"committed")
    quorum.run_until(lambda: all((quorum.client(n).high_watermark or 0) == leader.log.end_offset for n in (1, 2, 3)))
    empty = next(n for n in (1, 2, 3) if n != leader.node_id)
    quorum.wipe(empty)
    wiped = quorum.start(empty)
    # Its empty log loses every comparison: neither voter with the record grants it a vote.
    for other in (1, 2, 3):
        if other != empty:
            request = VoteRequest(empty, quorum.client(other).epoch + 1, 0, 0)
            assert not quorum.client(other).handle_vote(request, quorum.now).vote_granted
    quorum.kill(leader.node_id)
    new_leader = quorum.wait_for_active_leader()
    assert new_leader is not wiped
    quorum.run_until(lambda: wiped.log.end_offset == new_leader.log.end_offset)


def test_a_vote_is_durable_before_it_is_granted_and_never_given_twice_in_an_epoch(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    voter = quorum.client(3)
    epoch = voter.epoch + 1
    assert voter.handle_vote(VoteRequest(1, epoch, 0, 0), quorum.now).vote_granted
    quorum.kill(3)
    restarted = quorum.start(3)
    assert restarted.epoch == epoch and restarted.voted_id == 1
    assert not restarted.handle_vote(VoteRequest(2, epoch, 0, 0), quorum.now).vote_granted
    assert restarted.handle_vote(VoteRequest(1, epoch, 0, 0), quorum.now).vote_granted


def test_pre_vote_keeps_a_voter_cut_off_from_a_healthy_leader_from_disrupting_it(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    epoch = leader.epoch
    lonely = next(n for n in (1, 2, 3) if n != leader.node_id)
    # Only the leader's link with this voter is cut: it still reaches the third voter, which hears the leader.
    quorum.cut |= {(lonely, leader.node_id), (leader.node_id, lonely)}
    quorum.run_for(4 * quorum.config.fetch_timeout_ms)
    assert quorum.client(lonely).state_name in ("prospective", "follower")
    assert quorum.client(lonely).epoch == epoch
    assert leader.is_active_leader() and leader.epoch == epoch
    quorum.heal()
    quorum.run_until(lambda: quorum.client(lonely).state_name == "follower")
    assert leader.epoch == epoch


def test_a_leader_that_hears_from_no_majority_resigns(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    quorum.isolate(leader.node_id)
    quorum.run_for(2 * quorum.config.fetch_timeout_ms)
    assert not leader.is_leader


def test_a_leader_that_resigns_on_shutdown_is_replaced_without_waiting_for_a_fetch_timeout(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    leader.resign(quorum.now)
    quorum.run_for(50)
    quorum.kill(leader.node_id)
    took = quorum.run_until(lambda: quorum.active_leader() is not None)
    assert took < quorum.config.fetch_timeout_ms


def test_a_restarted_leader_resigns_its_old_epoch(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    node, epoch = leader.node_id, leader.epoch
    quorum.kill(node)
    restarted = quorum.start(node)
    assert restarted.state_name == "resigned" and restarted.epoch == epoch
    quorum.run_until(lambda: quorum.active_leader() is not None)


def test_the_log_epoch_wins_over_a_lost_quorum_state_file(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, [1, 2, 3])
    epoch = quorum.wait_for_active_leader().epoch
    quorum.run_until(lambda: all(quorum.client(n).log.last_epoch == epoch for n in (1, 2, 3)))
    quorum.kill(2)
    (tmp_path / "node-2" / "__cluster_metadata-0" / "quorum-state").unlink()
    assert quorum.start(2).epoch == epoch


def test_the_log_opens_again_with_its_epochs(tmp_path: Path) -> None:
    log = RaftLog(tmp_path, 0)
    log.append_leader_change(1, [1], [1], 1, 0)
    log.append_values([b"a"], 1, 0)
    log.append_leader_change(1, [1], [1], 3, 0)
    log.close()
    reopened = RaftLog(tmp_path, 0)
    assert reopened.end_offset == 3 and reopened.last_epoch == 3
    assert reopened.end_offset_for_epoch(2).offset == 2 and reopened.end_offset_for_epoch(2).epoch == 1


@pytest.mark.parametrize("seed", range(8))
def test_under_random_kills_cuts_and_disk_losses_committed_records_never_change(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    quorum = Quorum(tmp_path, [1, 2, 3], seed=seed)
    # The longest committed log seen so far: every replica's committed log must extend it or be extended by it.
    committed = b""
    for _ in range(40):
        action = rng.choice(["append", "append", "kill", "restart", "cut", "heal", "wait"])
        down = [n for n, c in quorum.nodes.items() if c is None]
        if action == "append" and quorum.active_leader() is not None:
            quorum.append(f"value-{rng.random()}".encode())
        elif action == "kill" and not down:
            quorum.kill(rng.choice([1, 2, 3]))
        elif action == "restart" and down:
            quorum.start(rng.choice(down))
        elif action == "cut":
            source, target = rng.sample([1, 2, 3], 2)
            quorum.cut.add((source, target))
        elif action == "heal":
            quorum.heal()
        quorum.run_for(rng.randrange(1, 3000))
        for client in quorum.nodes.values():
            if client is None:
                continue
            mine = client.read_committed(0, 1 << 30)
            assert mine.startswith(committed) or committed.startswith(mine), "a committed record changed"
            if len(mine) > len(committed):
                committed = mine
    quorum.heal()
    for node, client in list(quorum.nodes.items()):
        if client is None:
            quorum.start(node)
    # Once a majority can talk, a leader is elected within a bounded time and every log converges.
    quorum.run_until(lambda: quorum.active_leader() is not None, limit_ms=20_000)
    leader = quorum.active_leader()
    assert leader is not None
    quorum.append(b"last")
    quorum.run_until(
        lambda: all(quorum.client(n).high_watermark == leader.log.end_offset for n in (1, 2, 3)), limit_ms=20_000
    )
    assert leader.read_committed(0, 1 << 30).startswith(committed)
    assert len({quorum.committed_on(n) for n in (1, 2, 3)}) == 1


def test_next_wakeup_is_never_an_expired_retry_backoff(tmp_path: Path) -> None:
    """A request that failed is retried after controller.quorum.retry.backoff.ms; once it is sent again, its backoff
    no longer counts as a wakeup (it did, and a shell that polls whenever next_wakeup_ms is due spun)."""
    config = RaftConfig()
    client = RaftClient(
        1,
        [1, 2, 3],
        RaftLog(tmp_path, 0),
        FileQuorumStateStore(tmp_path / "quorum-state", frozenset({1, 2, 3})),
        config,
        0,
        random.Random(7),
    )
    now = client.next_wakeup_ms()
    votes = {out.destination: out.request for out in client.poll(now)}
    assert set(votes) == {2, 3}
    client.on_response(2, votes[2], None, now)
    now += config.retry_backoff_ms
    assert [out.destination for out in client.poll(now)] == [2]
    assert client.next_wakeup_ms() > now


def test_followers_learn_a_commit_at_once_rather_than_when_their_parked_fetch_times_out(tmp_path: Path) -> None:
    """The leader answers a parked fetch as soon as its high watermark moves past the one that follower last got
    (docs/quorum.md#fetch): a follower's committed log, which the broker on its node reads, trails the leader's by
    round trips, not by the fetch's wait."""
    quorum = Quorum(tmp_path, [1, 2, 3])
    leader = quorum.wait_for_active_leader()
    quorum.run_for(2 * quorum.config.fetch_max_wait_ms)  # every follower is parked at the leader
    offset = quorum.append(b"x")
    took = quorum.run_until(
        lambda: all(quorum.client(n).high_watermark == leader.log.end_offset for n in (1, 2, 3)),
        limit_ms=quorum.config.fetch_max_wait_ms,
    )
    assert leader.high_watermark == offset + 1
    # An append, a fetch back, the commit, its news: a few one-millisecond hops of the harness's network.
    assert took <= 10
