"""The classic group coordinator's state machine, step by step with explicit time (Kafka's GroupCoordinator)."""

from __future__ import annotations

from group_harness import REBALANCE_MS, SESSION_MS, Harness, subscription

from tierlog.common import TopicPartition
from tierlog.coordinator.group.group_metadata import GroupState

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
TPS_OTHER = TopicPartition("other", 0)


def state(h: Harness, group: str) -> GroupState:
    return h.coordinator.groups[group].state


def test_a_single_member_joins_syncs_and_the_group_is_stable() -> None:
    h = Harness()
    (joined,) = h.join("g")
    assert joined.error is None and joined.generation_id == 1 and joined.leader_id == joined.member_id
    assert joined.member_id.startswith("client-") and joined.protocol_name == "range"
    assert [m.member_id for m in joined.members] == [joined.member_id]
    assert state(h, "g") is GroupState.COMPLETING_REBALANCE
    (synced,) = h.sync("g", joined.member_id, 1, {joined.member_id: b"mine"})
    assert (synced.error, synced.assignment, synced.protocol_type) == (None, b"mine", "consumer")
    assert state(h, "g") is GroupState.STABLE
    assert h.heartbeat("g", joined.member_id, 1) is None


def test_three_members_share_one_generation_and_only_the_leader_gets_the_member_list() -> None:
    h = Harness(group_initial_rebalance_delay_ms=3000)
    answers = [h.join("g", client_id=f"c{i}") for i in range(3)]
    h.advance(3000)
    # Members arrived during the initial delay, so it was extended once more (Kafka's InitialDelayedJoin).
    assert all(a == [] for a in answers)
    h.advance(3000)
    results = [a[0] for a in answers]
    assert {r.generation_id for r in results} == {1}
    leader = results[0].leader_id
    assert all(r.leader_id == leader for r in results)
    assert [len(r.members) for r in results] == [3 if r.member_id == leader else 0 for r in results]
    followers = [r.member_id for r in results if r.member_id != leader]
    parked = [h.sync("g", f, 1) for f in followers]
    assert parked == [[], []]  # followers wait for the leader's assignment
    (lead,) = h.sync("g", leader, 1, {r.member_id: r.member_id.encode() for r in results})
    assert lead.assignment == leader.encode()
    assert [p[0].assignment for p in parked] == [f.encode() for f in followers]


def test_initial_rebalance_delay_extends_while_members_keep_arriving() -> None:
    h = Harness(group_initial_rebalance_delay_ms=3000)
    first = h.join("g", client_id="a")
    h.advance(2999)
    second = h.join("g", client_id="b")
    h.advance(1)  # the first delay ends, but a member arrived during it: wait another delay
    assert first == [] and second == []
    h.advance(2999)
    assert first == []
    h.advance(1)
    assert first[0].generation_id == second[0].generation_id == 1


def test_a_new_member_forces_a_rebalance_and_members_that_do_not_rejoin_are_removed() -> None:
    h = Harness()
    (a, b), generation = h.stable_group("g", 2)
    c = h.join("g", client_id="c")
    assert state(h, "g") is GroupState.PREPARING_REBALANCE
    assert h.heartbeat("g", a, generation) == "REBALANCE_IN_PROGRESS"
    rejoined = h.join("g", a)
    h.advance(SESSION_MS)  # b neither rejoins nor heartbeats: its session expires and the join completes
    assert rejoined[0].generation_id == c[0].generation_id == generation + 1
    assert set(h.coordinator.groups["g"].members) == {a, c[0].member_id}
    assert h.heartbeat("g", b, generation) == "UNKNOWN_MEMBER_ID"
    assert h.heartbeat("g", a, generation) == "ILLEGAL_GENERATION"


def test_a_leaving_member_triggers_a_rebalance_of_the_rest() -> None:
    h = Harness()
    (a, b, c), generation = h.stable_group("g", 3)
    assert h.coordinator.leave_group("g", [(b, None)], h.now) == (None, [None])
    assert state(h, "g") is GroupState.PREPARING_REBALANCE
    ja, jc = h.join("g", a), h.join("g", c)
    assert ja[0].generation_id == jc[0].generation_id == generation + 1
    assert ja[0].leader_id == a and {m.member_id for m in ja[0].members} == {a, c} and jc[0].members == ()


def test_a_member_without_heartbeats_is_removed_after_its_session_timeout() -> None:
    h = Harness()
    (a, b), generation = h.stable_group("g", 2)
    for _ in range(2):
        h.advance(SESSION_MS * 2 // 5)
        assert h.heartbeat("g", a, generation) is None
    h.advance(SESSION_MS * 2 // 5)
    # b has been silent for 1.2 session timeouts: gone, and the group rebalances.
    assert b not in h.coordinator.groups["g"].members
    assert h.heartbeat("g", a, generation) == "REBALANCE_IN_PROGRESS"


def test_the_last_member_leaving_empties_the_group_and_its_metadata_is_stored() -> None:
    h = Harness()
    (a,), generation = h.stable_group("g", 1)
    h.coordinator.leave_group("g", [(a, None)], h.now)
    group = h.coordinator.groups["g"]
    assert group.state is GroupState.EMPTY and group.generation_id == generation + 1


def test_join_with_require_known_member_id_returns_member_id_required_then_joins() -> None:
    h = Harness()
    (first,) = h.join("g", require_known=True)
    assert first.error == "MEMBER_ID_REQUIRED" and first.member_id.startswith("client-")
    (second,) = h.join("g", first.member_id, require_known=True)
    assert second.error is None and second.member_id == first.member_id


def test_a_pending_member_id_expires_after_the_session_timeout() -> None:
    h = Harness()
    (first,) = h.join("g", require_known=True)
    h.advance(SESSION_MS)
    (second,) = h.join("g", first.member_id, require_known=True)
    assert second.error == "UNKNOWN_MEMBER_ID"


def test_a_static_member_rejoining_takes_its_place_and_the_old_member_id_is_fenced() -> None:
    h = Harness()
    (_a, old_b), generation = h.stable_group("g", 2, instances=["i-a", "i-b"])
    assert state(h, "g") is GroupState.STABLE
    # The instance i-b restarts: same instance id, no member id.
    (rejoined,) = h.join("g", instance="i-b", client_id="b")
    assert rejoined.error is None and rejoined.member_id != old_b
    assert rejoined.generation_id == generation  # no rebalance: same protocol, assignment kept
    assert state(h, "g") is GroupState.STABLE
    assert h.heartbeat("g", old_b, generation, instance="i-b") == "FENCED_INSTANCE_ID"
    assert h.heartbeat("g", rejoined.member_id, generation, instance="i-b") is None
    (synced,) = h.sync("g", rejoined.member_id, generation, instance="i-b")
    assert synced.assignment == old_b.encode()


def test_join_errors() -> None:
    h = Harness(group_max_size=1)
    assert h.join("")[0].error == "INVALID_GROUP_ID"
    assert h.join("g", session_ms=5999)[0].error == "INVALID_SESSION_TIMEOUT"
    assert h.join("g", session_ms=1_800_001)[0].error == "INVALID_SESSION_TIMEOUT"
    assert h.join("g", "unknown-member")[0].error == "UNKNOWN_MEMBER_ID"
    assert h.join("g", protocol_type="")[0].error == "INCONSISTENT_GROUP_PROTOCOL"
    (a,), generation = h.stable_group("g", 1)
    assert h.join("g")[0].error == "GROUP_MAX_SIZE_REACHED"
    assert h.join("g", a, protocols=[("roundrobin", b"")])[0].error == "INCONSISTENT_GROUP_PROTOCOL"
    assert h.join("g", a, protocol_type="connect")[0].error == "INCONSISTENT_GROUP_PROTOCOL"
    assert h.join("g", a, instance="never-seen")[0].error == "UNKNOWN_MEMBER_ID"
    assert h.heartbeat("g", a, generation) is None  # none of the refused joins disturbed the group


def test_protocol_is_chosen_by_vote_among_those_every_member_supports() -> None:
    h = Harness(group_initial_rebalance_delay_ms=100)
    a = h.join("g", protocols=[("cooperative-sticky", b"a"), ("range", b"a-range")])
    b = h.join("g", protocols=[("range", b"b"), ("cooperative-sticky", b"b-coop")])
    c = h.join("g", protocols=[("cooperative-sticky", b"c"), ("range", b"c-range")])
    h.advance(200)
    assert {x[0].protocol_name for x in (a, b, c)} == {"cooperative-sticky"}
    leader = next(x[0] for x in (a, b, c) if x[0].members)
    assert sorted(m.metadata for m in leader.members) == [b"a", b"b-coop", b"c"]


def test_sync_and_heartbeat_errors() -> None:
    h = Harness()
    (a, _b), generation = h.stable_group("g", 2)
    assert h.sync("g", "nobody", generation)[0].error == "UNKNOWN_MEMBER_ID"
    assert h.sync("g", a, generation + 1)[0].error == "ILLEGAL_GENERATION"
    assert h.sync("other", a, generation)[0].error == "UNKNOWN_MEMBER_ID"
    assert h.heartbeat("g", "nobody", generation) == "UNKNOWN_MEMBER_ID"
    assert h.heartbeat("g", a, generation - 1) == "ILLEGAL_GENERATION"
    answers: list = []
    h.coordinator.sync_group("g", generation, a, None, "connect", None, {}, h.now, answers.append)
    assert answers[0].error == "INCONSISTENT_GROUP_PROTOCOL"
    h.join("g", client_id="c")
    assert h.sync("g", a, generation)[0].error == "REBALANCE_IN_PROGRESS"


def test_a_member_that_never_syncs_is_removed_when_the_sync_round_times_out() -> None:
    h = Harness()
    results = h.join_all("g", 2)
    generation, leader = results[0].generation_id, results[0].leader_id
    follower = next(r.member_id for r in results if r.member_id != leader)
    h.sync("g", leader, generation, {})
    assert state(h, "g") is GroupState.STABLE
    h.advance(REBALANCE_MS)
    assert follower not in h.coordinator.groups["g"].members
    assert state(h, "g") is not GroupState.STABLE


def test_a_failed_assignment_store_answers_every_member_and_rebalances() -> None:
    h = Harness()
    results = h.join_all("g", 2)
    generation, leader = results[0].generation_id, results[0].leader_id
    follower = next(r.member_id for r in results if r.member_id != leader)
    parked = h.sync("g", follower, generation)
    h.appends.hold = True
    lead = h.sync("g", leader, generation, {leader: b"x", follower: b"y"})
    assert lead == [] and parked == []
    h.appends.release("NOT_LEADER_OR_FOLLOWER")
    assert lead[0].error == parked[0].error == "NOT_COORDINATOR"
    assert state(h, "g") is GroupState.PREPARING_REBALANCE


def test_offset_commit_by_members_and_standalone_clients() -> None:
    h = Harness()
    (a,), generation = h.stable_group("g", 1)
    assert h.commit("g", {TP0: 5}, a, generation) == [{TP0: None}]
    assert h.committed("g", TP0) == 5
    assert h.commit("g", {TP0: 6}) == [{TP0: "UNKNOWN_MEMBER_ID"}]  # standalone commit to a group with members
    assert h.commit("g", {TP0: 6}, "nobody", generation) == [{TP0: "UNKNOWN_MEMBER_ID"}]
    assert h.commit("g", {TP0: 6}, a, generation + 1) == [{TP0: "ILLEGAL_GENERATION"}]
    assert h.commit("unknown-group", {TP0: 6}, a, 3) == [{TP0: "ILLEGAL_GENERATION"}]
    assert h.commit("standalone", {TP0: 9}) == [{TP0: None}]
    assert h.committed("standalone", TP0) == 9
    assert h.committed("g", TP0) == 5  # nothing of the refused commits landed


def test_offset_commit_is_refused_while_the_assignment_is_not_out_yet() -> None:
    h = Harness()
    (joined,) = h.join("g")
    assert h.commit("g", {TP0: 1}, joined.member_id, joined.generation_id) == [{TP0: "REBALANCE_IN_PROGRESS"}]


def test_oversized_commit_metadata_is_refused_per_partition_and_nothing_is_stored() -> None:
    h = Harness()
    answers = h.commit("g", {TP0: 1}, metadata="x" * 4097)
    assert answers == [{TP0: "OFFSET_METADATA_TOO_LARGE"}]
    assert h.committed("g", TP0) == -1
    assert h.commit("g", {TP0: 1}, metadata="x" * 4096) == [{TP0: None}]


def test_committed_offsets_become_visible_only_once_appended() -> None:
    h = Harness()
    h.appends.hold = True
    answers = h.commit("g", {TP0: 7})
    assert answers == [] and h.committed("g", TP0) == -1
    h.appends.release()
    assert answers == [{TP0: None}] and h.committed("g", TP0) == 7
    h.appends.hold = True
    answers = h.commit("g", {TP0: 8})
    h.appends.release("NOT_ENOUGH_REPLICAS")
    assert answers == [{TP0: "COORDINATOR_NOT_AVAILABLE"}] and h.committed("g", TP0) == 7
    h.appends.hold = True
    answers = h.commit("g", {TP0: 8})
    h.appends.release("RECORD_TOO_LARGE")
    assert answers == [{TP0: "INVALID_COMMIT_OFFSET_SIZE"}]


def test_offset_fetch_of_all_partitions_and_unknown_ones() -> None:
    h = Harness()
    h.commit("g", {TP0: 1, TP1: 2}, metadata="m")
    error, offsets = h.coordinator.fetch_offsets("g", None)
    assert error is None and {tp: o.offset for tp, o in offsets.items()} == {TP0: 1, TP1: 2}
    assert offsets[TP0].metadata == "m"
    error, offsets = h.coordinator.fetch_offsets("nobody", [TP0])
    assert (error, offsets[TP0].offset, offsets[TP0].metadata) == (None, -1, "")


def test_not_coordinator_and_loading() -> None:
    h = Harness()
    partition = h.coordinator.partition_for("g")
    h.coordinator.on_resignation(partition, h.now)
    assert h.join("g")[0].error == "NOT_COORDINATOR"
    assert h.commit("g", {TP0: 1}) == [{TP0: "NOT_COORDINATOR"}]
    h.coordinator.on_election(partition, 1)
    assert h.join("g")[0].error == "COORDINATOR_LOAD_IN_PROGRESS"
    assert h.coordinator.fetch_offsets("g", [TP0])[0] == "COORDINATOR_LOAD_IN_PROGRESS"
    assert h.heartbeat("g", "m", 1) is None  # answered blindly while loading, as Kafka
    assert h.sync("g", "m", 1)[0].error == "REBALANCE_IN_PROGRESS"
    h.coordinator.complete_load(partition, 1, [], h.now)
    assert h.join("g")[0].error is None


def test_resigning_answers_parked_members_not_coordinator() -> None:
    h = Harness(group_initial_rebalance_delay_ms=1000)
    parked = h.join("g")
    h.coordinator.on_resignation(h.coordinator.partition_for("g"), h.now)
    assert parked[0].error == "NOT_COORDINATOR"
    assert "g" not in h.coordinator.groups


def test_leave_group_by_instance_id_and_errors() -> None:
    h = Harness()
    (_a,) = h.join("g", instance="i-a")
    assert h.coordinator.leave_group("g", [("", "i-a"), ("", "i-x"), ("nobody", None)], h.now) == (
        None,
        [None, "UNKNOWN_MEMBER_ID", "UNKNOWN_MEMBER_ID"],
    )
    assert h.coordinator.leave_group("missing", [("m", None)], h.now) == (None, ["UNKNOWN_MEMBER_ID"])
    assert h.coordinator.leave_group("", [("m", None)], h.now) == ("INVALID_GROUP_ID", [])


def test_list_describe_and_delete_groups() -> None:
    h = Harness()
    (a,), _generation = h.stable_group("busy", 1)
    h.commit("idle", {TP0: 3})
    error, groups = h.coordinator.list_groups(set(), set())
    assert error is None and {(g.group_id, g.state) for g in groups} == {("busy", "Stable"), ("idle", "Empty")}
    assert [g.group_id for g in h.coordinator.list_groups({"stable"}, set())[1]] == ["busy"]
    assert h.coordinator.list_groups(set(), {"consumer"})[1] == []
    described = h.coordinator.describe_group("busy")
    assert (described.state, described.protocol, described.members[0].assignment) == ("Stable", "range", a.encode())
    assert described.members[0].metadata == subscription("events")
    assert h.coordinator.describe_group("nothing").state == "Dead"
    assert h.coordinator.delete_groups(["busy", "idle", "nothing"], h.now) == {
        "busy": "NON_EMPTY_GROUP",
        "idle": None,
        "nothing": "GROUP_ID_NOT_FOUND",
    }
    assert h.committed("idle", TP0) == -1 and "idle" not in h.coordinator.groups


def test_offset_delete_refuses_topics_a_stable_consumer_group_subscribes_to() -> None:
    h = Harness()
    (a,), generation = h.stable_group("g", 1)
    other = TopicPartition("other", 0)
    h.commit("g", {TP0: 1, other: 2}, a, generation)
    error, results = h.coordinator.delete_offsets("g", [TP0, other], h.now)
    assert (error, results) == (None, {TP0: "GROUP_SUBSCRIBED_TO_TOPIC", other: None})
    assert h.committed("g", other) == -1 and h.committed("g", TP0) == 1
    assert h.coordinator.delete_offsets("none", [TP0], h.now)[0] == "GROUP_ID_NOT_FOUND"


def test_offsets_of_an_empty_group_expire_after_the_retention_then_the_group_is_gone() -> None:
    h = Harness(offsets_retention_ms=60_000)
    (a,), generation = h.stable_group("g", 1)
    h.commit("g", {TP0: 4}, a, generation)
    for _ in range(10):
        h.advance(5_000)
        h.heartbeat("g", a, generation)
    assert h.coordinator.cleanup_group_metadata(h.now) == 0  # Stable and subscribed to events: kept
    h.coordinator.leave_group("g", [(a, None)], h.now)
    h.advance(59_999)
    assert h.coordinator.cleanup_group_metadata(h.now) == 0
    h.advance(1)
    assert h.coordinator.cleanup_group_metadata(h.now) == 1
    assert "g" not in h.coordinator.groups


def test_group_metadata_is_persisted_after_sync_and_when_the_group_empties() -> None:
    h = Harness()
    (a,), _generation = h.stable_group("g", 1)
    partition = h.coordinator.partition_for("g")
    assert len(h.appends.log[partition]) == 1
    h.coordinator.leave_group("g", [(a, None)], h.now)
    assert len(h.appends.log[partition]) == 2


def test_a_replaced_static_member_must_heartbeat_once_its_slow_store_completes() -> None:
    h = Harness()
    (a, _b), generation = h.stable_group("g", 2, instances=["i-a", "i-b"])
    h.appends.hold = True
    rejoined = h.join("g", instance="i-b", client_id="b")
    for _ in range(3):  # the store takes longer than a session; a keeps heartbeating, b waits in JoinGroup
        h.advance(SESSION_MS // 2)
        assert h.heartbeat("g", a, generation) is None
    h.appends.release()
    new_b = rejoined[0].member_id
    assert rejoined[0].error is None and h.coordinator.groups["g"].has(new_b)
    h.advance(SESSION_MS // 2)
    assert h.heartbeat("g", a, generation) is None
    h.advance(SESSION_MS // 2)
    # b never heartbeated after its answer: its session expired like any member's.
    assert not h.coordinator.groups["g"].has(new_b)


def test_a_fenced_static_instance_cannot_commit_sync_or_leave() -> None:
    h = Harness()
    (old,), generation = h.stable_group("g", 1, instances=["i-a"])
    (new,) = h.join("g", instance="i-a", client_id="a")
    assert new.error is None and new.member_id != old
    assert h.commit("g", {TP0: 1}, old, generation, instance="i-a") == [{TP0: "FENCED_INSTANCE_ID"}]
    assert h.sync("g", old, generation, instance="i-a")[0].error == "FENCED_INSTANCE_ID"
    assert h.join("g", old, instance="i-a")[0].error == "FENCED_INSTANCE_ID"
    assert h.coordinator.leave_group("g", [(old, "i-a")], h.now) == (None, ["FENCED_INSTANCE_ID"])
    assert h.commit("g", {TP0: 1}, new.member_id, generation, instance="i-a") == [{TP0: None}]


def test_group_max_size_counts_members_waiting_in_a_rebalance() -> None:
    h = Harness(group_max_size=2)
    (a, b), _generation = h.stable_group("g", 2)
    assert h.join("g")[0].error == "GROUP_MAX_SIZE_REACHED"
    h.coordinator.leave_group("g", [(b, None)], h.now)
    # During a rebalance Kafka counts the members that joined it, not the old ones: c and d get in, and a,
    # rejoining last, is the one refused.
    assert h.join("g", client_id="c") == [] and h.join("g", client_id="d") == []
    assert h.join("g", a)[0].error == "GROUP_MAX_SIZE_REACHED"
    assert h.join("g", client_id="e")[0].error == "GROUP_MAX_SIZE_REACHED"


def test_describe_shows_member_metadata_and_assignment_only_when_stable() -> None:
    h = Harness()
    (_joined,) = h.join("g")
    described = h.coordinator.describe_group("g")
    assert described.state == "CompletingRebalance" and described.protocol == ""
    assert (described.members[0].metadata, described.members[0].assignment) == (b"", b"")


def test_an_empty_group_s_offsets_can_all_be_deleted_and_requests_wait_while_loading() -> None:
    h = Harness()
    h.commit("g", {TP0: 1, TP1: 2})
    assert h.coordinator.delete_offsets("g", [TP0], h.now) == (None, {TP0: None})
    assert h.committed("g", TP0) == -1 and h.committed("g", TP1) == 2
    partition = h.coordinator.partition_for("g")
    h.coordinator.on_resignation(partition, h.now)
    h.coordinator.on_election(partition, 1)
    assert h.commit("g", {TP0: 1}) == [{TP0: "COORDINATOR_LOAD_IN_PROGRESS"}]
    assert h.coordinator.delete_groups(["g"], h.now) == {"g": "COORDINATOR_LOAD_IN_PROGRESS"}
    assert h.coordinator.list_groups(set(), set())[0] == "COORDINATOR_LOAD_IN_PROGRESS"
    assert h.coordinator.describe_group("g").error == "COORDINATOR_LOAD_IN_PROGRESS"


def test_a_leader_rejoining_a_stable_group_starts_a_rebalance_and_a_follower_with_same_metadata_does_not() -> None:
    h = Harness()
    (a, b), generation = h.stable_group("g", 2)
    leader = h.coordinator.groups["g"].leader_id
    follower = b if leader == a else a
    (same,) = h.join("g", follower)
    assert (same.error, same.generation_id, same.members) == (None, generation, ())
    assert state(h, "g") is GroupState.STABLE
    assert h.join("g", leader) == []
    assert state(h, "g") is GroupState.PREPARING_REBALANCE


def test_a_commit_completing_after_the_partition_moved_is_still_a_success_and_loads_at_the_new_leader() -> None:
    h = Harness()
    h.appends.hold = True
    answers = h.commit("g", {TP0: 9})
    h.coordinator.on_resignation(h.coordinator.partition_for("g"), h.now)
    h.appends.release()
    assert answers == [{TP0: None}]
    partition = h.coordinator.partition_for("g")
    h.coordinator.on_election(partition, 1)
    h.coordinator.complete_load(partition, 1, h.appends.log[partition], h.now)
    assert h.committed("g", TP0) == 9


def test_offsets_of_a_group_whose_subscription_cannot_be_read_are_never_deleted_while_it_has_members() -> None:
    h = Harness()
    answers = h.join("g", protocols=[("range", b"\x00\x00\x7f\xff\xff\xff garbage")])
    member, generation = answers[0].member_id, answers[0].generation_id
    h.sync("g", member, generation, {member: b""})
    h.commit("g", {TPS_OTHER: 3}, member, generation)
    assert h.coordinator.delete_offsets("g", [TPS_OTHER], h.now) == (None, {TPS_OTHER: "GROUP_SUBSCRIBED_TO_TOPIC"})
    assert h.committed("g", TPS_OTHER) == 3
