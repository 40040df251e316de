"""Loading a __consumer_offsets partition (what a new coordinator does after failover) rebuilds exactly the
groups and offsets the old coordinator had stored: latest value per key wins, tombstones delete."""

from __future__ import annotations

from group_harness import T0, Harness
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.common import TopicPartition
from tierlog.coordinator.group.group_coordinator import GroupConfig, GroupCoordinator
from tierlog.coordinator.group.group_metadata import GroupState
from tierlog.coordinator.group.records import OffsetCommitKey, encode_offset_commit_key

GROUPS = ["alpha", "beta", "gamma"]
TPS = [TopicPartition("events", p) for p in range(3)]


def reload(h: Harness) -> GroupCoordinator:
    """A fresh coordinator that loads every partition from what `h` appended."""
    loaded = GroupCoordinator(h.config, lambda partition, records, now, on_done, producer=None: on_done(None, now))
    for partition in range(h.config.offsets_topic_num_partitions):
        loaded.on_election(partition, 1)
        loaded.complete_load(partition, 1, h.appends.log.get(partition, []), h.now)
    return loaded


def assert_loaded_equals_live(h: Harness) -> None:
    live = h.coordinator
    loaded = reload(h)
    for group_id in GROUPS:
        group = live.groups.get(group_id)
        for tp in TPS:
            assert loaded.fetch_offsets(group_id, [tp]) == live.fetch_offsets(group_id, [tp]), (group_id, tp)
            stable = loaded.fetch_offsets(group_id, [tp], require_stable=True)
            assert stable == live.fetch_offsets(group_id, [tp], require_stable=True), (group_id, tp)
        if group is None:
            assert group_id not in loaded.groups
            continue
        if not group.is_in(GroupState.STABLE, GroupState.EMPTY) or (group.generation_id == 0 and not group.offsets):
            continue  # mid-rebalance or never stored: a new coordinator sees the last stored generation
        copy = loaded.groups[group_id]
        assert (copy.state, copy.generation_id, copy.protocol_type, copy.protocol_name, copy.leader_id) == (
            group.state,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id,
        )
        assert {m: x.assignment for m, x in copy.members.items()} == {m: x.assignment for m, x in group.members.items()}
        assert copy.static_members == group.static_members


operations = st.lists(
    st.tuples(
        st.sampled_from(
            # join and sync twice over: a group must often get as far as Stable for the test to mean much.
            [
                "join",
                "join",
                "rejoin",
                "sync",
                "sync",
                "heartbeat",
                "leave",
                "commit",
                "member-commit",
                "delete",
                "delete-offset",
                "tick",
                # Transactions of producers 0-2: offsets pending until the marker (docs/transactions.md#offsets).
                "txn-commit",
                "txn-commit",
                "end-commit",
                "end-abort",
            ]
        ),
        st.sampled_from(GROUPS),
        st.integers(0, 2),
    ),
    min_size=10,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(operations)
def test_replaying_the_partition_rebuilds_what_was_stored(steps: list[tuple[str, str, int]]) -> None:
    h = Harness()
    members: dict[str, list[str]] = {g: [] for g in GROUPS}
    for op, group_id, n in steps:
        group = h.coordinator.groups.get(group_id)
        known = [m for m in members[group_id] if group is not None and group.has(m)]
        member = known[n % len(known)] if known else ""
        generation = group.generation_id if group is not None else -1
        if op == "join":
            answers = h.join(group_id, client_id=f"c{n}", instance=f"i{n}" if n == 2 else None)
            members[group_id] += [a.member_id for a in answers if a.error is None]
        elif op == "rejoin" and member:
            h.join(group_id, member, instance=group.get(member).group_instance_id)  # type: ignore[union-attr]
        elif op == "sync" and member:
            h.sync(group_id, member, generation, {m: f"{m}@{generation}".encode() for m in known})
        elif op == "heartbeat":
            for m in known:
                h.heartbeat(group_id, m, generation)
        elif op == "leave" and member:
            h.coordinator.leave_group(group_id, [(member, None)], h.now)
        elif op == "commit":
            h.commit(group_id, {TPS[n]: h.now - T0 + n})
        elif op == "member-commit" and member:
            h.commit(group_id, {TPS[n]: h.now - T0 + n}, member, generation, metadata=f"m{n}")
        elif op == "delete":
            h.coordinator.delete_groups([group_id], h.now)
        elif op == "delete-offset":
            h.coordinator.delete_offsets(group_id, [TPS[n]], h.now)
        elif op == "tick":
            h.advance(2000 * (n + 1))
        elif op == "txn-commit":
            h.txn_commit(group_id, n, {TPS[(n + len(steps)) % 3]: h.now - T0 + n})
        elif op in ("end-commit", "end-abort"):
            h.end_txn(group_id, n, committed=op == "end-commit")
        h.advance(0)
        # After every step: a failover may happen at any moment.
        assert_loaded_equals_live(h)


def test_a_tombstone_deletes_an_offset_and_a_later_commit_brings_it_back() -> None:
    h = Harness()
    h.commit("alpha", {TPS[0]: 5})
    h.coordinator.delete_offsets("alpha", [TPS[0]], h.now)
    assert reload(h).fetch_offsets("alpha", [TPS[0]])[1][TPS[0]].offset == -1
    h.commit("alpha", {TPS[0]: 6})
    assert reload(h).fetch_offsets("alpha", [TPS[0]])[1][TPS[0]].offset == 6


def test_an_unreadable_record_is_skipped_and_every_other_group_loads() -> None:
    h = Harness()
    h.commit("alpha", {TPS[0]: 5})
    partition = h.coordinator.partition_for("alpha")
    h.appends.log[partition].insert(0, (encode_offset_commit_key(OffsetCommitKey("alpha", "x", 0)), b"\x00\x03"))
    loaded = reload(h)
    assert loaded.fetch_offsets("alpha", [TPS[0]])[1][TPS[0]].offset == 5


def test_loading_is_ignored_after_resignation_or_for_another_epoch() -> None:
    h = Harness()
    h.commit("alpha", {TPS[0]: 5})
    partition = h.coordinator.partition_for("alpha")
    coordinator = GroupCoordinator(
        GroupConfig(offsets_topic_num_partitions=h.config.offsets_topic_num_partitions), h.appends
    )
    coordinator.on_election(partition, 3)
    coordinator.complete_load(partition, 2, h.appends.log[partition], h.now)  # an older election's load
    assert coordinator.is_loading(partition)
    coordinator.on_resignation(partition, h.now)
    coordinator.complete_load(partition, 3, h.appends.log[partition], h.now)
    assert coordinator.fetch_offsets("alpha", [TPS[0]])[0] == "NOT_COORDINATOR"
