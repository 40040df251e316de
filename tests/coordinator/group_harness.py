"""A GroupCoordinator driven step by step: explicit now_ms, an in-memory __consumer_offsets, answers collected."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from tierlog.common import TopicPartition
from tierlog.coordinator.group.group_coordinator import (
    AppendCallback,
    GroupConfig,
    GroupCoordinator,
    LoadEntry,
    Record,
    TxnMarker,
    TxnProducer,
    TxnRecord,
)
from tierlog.coordinator.group.member_metadata import JoinGroupResult, SyncGroupResult
from tierlog.coordinator.group.records import OffsetAndMetadata

PARTITIONS = 4
SESSION_MS = 10_000
REBALANCE_MS = 30_000
T0 = 1_700_000_000_000


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0: version, topics, user data (null)."""
    parts = [struct.pack(">hi", 0, len(topics))]
    for topic in topics:
        parts.append(struct.pack(">h", len(topic)) + topic.encode())
    parts.append(struct.pack(">i", -1))
    return b"".join(parts)


@dataclass
class Appends:
    """__consumer_offsets in memory: every appended record per partition (a transactional batch's as TxnRecord,
    markers as TxnMarker), as a load reads them back; appends complete at once unless held."""

    log: dict[int, list[LoadEntry]] = field(default_factory=dict)
    hold: bool = False
    fail_with: str | None = None
    held: list[tuple[int, list[LoadEntry], AppendCallback]] = field(default_factory=list)
    # The harness's clock: when a held append completes.
    clock: Callable[[], int] = lambda: 0

    def __call__(
        self,
        partition: int,
        records: list[Record],
        now_ms: int,
        on_done: AppendCallback,
        producer: TxnProducer | None = None,
    ) -> None:
        entries: list[LoadEntry] = (
            list(records) if producer is None else [TxnRecord(producer.producer_id, k, v) for k, v in records]
        )
        if self.hold:
            self.held.append((partition, entries, on_done))
            return
        self._finish(partition, entries, on_done, self.fail_with)

    def _finish(self, partition: int, entries: list[LoadEntry], on_done: AppendCallback, error: str | None) -> None:
        if error is None:
            self.log.setdefault(partition, []).extend(entries)
        on_done(error, self.clock())

    def release(self, error: str | None = None) -> None:
        held, self.held = self.held, []
        for partition, entries, on_done in held:
            self._finish(partition, entries, on_done, error)


class Harness:
    def __init__(self, config: GroupConfig | None = None, **overrides: int) -> None:
        defaults = dict(offsets_topic_num_partitions=PARTITIONS, group_initial_rebalance_delay_ms=0)
        defaults.update(overrides)
        self.config = config or GroupConfig(**defaults)  # type: ignore[arg-type]
        self.appends = Appends()
        self.appends.clock = lambda: self.now
        ids = itertools.count(1)
        self.coordinator = GroupCoordinator(self.config, self.appends, new_uuid=lambda: f"uuid{next(ids)}")
        self.now = T0
        for partition in range(self.config.offsets_topic_num_partitions):
            self.coordinator.on_election(partition, 0)
            self.coordinator.complete_load(partition, 0, [], self.now)

    def advance(self, ms: int) -> None:
        """Move the clock and fire every deadline passed on the way, in order, as the shell's timer would."""
        target = self.now + ms
        while (deadline := self.coordinator.next_deadline_ms()) is not None and deadline <= target:
            self.now = max(self.now, deadline)
            self.coordinator.on_timer(self.now)
        self.now = target

    def join(
        self,
        group: str,
        member_id: str = "",
        *,
        instance: str | None = None,
        protocols: list[tuple[str, bytes]] | None = None,
        require_known: bool = False,
        session_ms: int = SESSION_MS,
        rebalance_ms: int = REBALANCE_MS,
        client_id: str = "client",
        protocol_type: str = "consumer",
    ) -> list[JoinGroupResult]:
        """The answers collect in the returned list (empty while the request is parked). Deadlines due now
        (a zero initial rebalance delay) fire at once, as the shell's timer would."""
        answers: list[JoinGroupResult] = []
        self.coordinator.join_group(
            group,
            member_id,
            instance,
            require_known,
            client_id,
            "/127.0.0.1",
            rebalance_ms,
            session_ms,
            protocol_type,
            protocols if protocols is not None else [("range", subscription("events"))],
            self.now,
            answers.append,
        )
        self.advance(0)
        return answers

    def sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        instance: str | None = None,
    ) -> list[SyncGroupResult]:
        answers: list[SyncGroupResult] = []
        self.coordinator.sync_group(
            group, generation, member_id, instance, None, None, assignments or {}, self.now, answers.append
        )
        return answers

    def heartbeat(self, group: str, member_id: str, generation: int, instance: str | None = None) -> str | None:
        return self.coordinator.heartbeat(group, member_id, instance, generation, self.now)

    def commit(
        self,
        group: str,
        offsets: dict[TopicPartition, int],
        member_id: str = "",
        generation: int = -1,
        metadata: str = "",
        instance: str | None = None,
    ) -> list[dict[TopicPartition, str | None]]:
        answers: list[dict[TopicPartition, str | None]] = []
        self.coordinator.commit_offsets(
            group,
            member_id,
            instance,
            generation,
            {tp: OffsetAndMetadata(o, -1, metadata, self.now) for tp, o in offsets.items()},
            self.now,
            answers.append,
        )
        return answers

    def txn_commit(
        self,
        group: str,
        producer_id: int,
        offsets: dict[TopicPartition, int],
        member_id: str = "",
        generation: int = -1,
        instance: str | None = None,
        producer_epoch: int = 0,
    ) -> list[dict[TopicPartition, str | None]]:
        """A TxnOffsetCommit of `producer_id`; answers collect in the returned list."""
        answers: list[dict[TopicPartition, str | None]] = []
        self.coordinator.commit_transactional_offsets(
            group,
            TxnProducer(producer_id, producer_epoch),
            member_id,
            instance,
            generation,
            {tp: OffsetAndMetadata(o, -1, "", self.now) for tp, o in offsets.items()},
            self.now,
            answers.append,
        )
        return answers

    def end_txn(self, group: str, producer_id: int, committed: bool) -> None:
        """The producer's marker is written to the group's partition, then the coordinator is told (as
        WriteTxnMarkers does)."""
        partition = self.coordinator.partition_for(group)
        self.appends.log.setdefault(partition, []).append(TxnMarker(producer_id, committed))
        self.coordinator.complete_transaction(partition, producer_id, committed)

    def committed(self, group: str, tp: TopicPartition) -> int:
        error, offsets = self.coordinator.fetch_offsets(group, [tp])
        assert error is None
        return offsets[tp].offset

    def join_all(self, group: str, members: int, instances: list[str] | None = None) -> list[JoinGroupResult]:
        """`members` new members in one generation (CompletingRebalance). With no initial delay the first member
        completes a generation alone, so members rejoin until all are in one."""
        answers = [
            self.join(group, client_id=f"c{i}", instance=instances[i] if instances else None) for i in range(members)
        ]
        metadata = self.coordinator.groups[group]
        while metadata.state.value == "PreparingRebalance":
            for i, a in enumerate(answers):
                if a and not metadata.get(a[-1].member_id).is_awaiting_join:
                    answers[i] = self.join(group, a[-1].member_id, instance=instances[i] if instances else None)
        results = [a[-1] for a in answers]
        assert all(r.error is None for r in results), results
        assert {r.generation_id for r in results} == {metadata.generation_id}
        return results

    def stable_group(self, group: str, members: int, instances: list[str] | None = None) -> tuple[list[str], int]:
        """`members` members joined and synced, the leader's assignment being each member's id: (ids, generation)."""
        results = self.join_all(group, members, instances)
        ids = [r.member_id for r in results]
        metadata = self.coordinator.groups[group]
        generation, leader = metadata.generation_id, metadata.leader_id
        syncs = {
            m: self.sync(
                group,
                m,
                generation,
                {i: i.encode() for i in ids} if m == leader else None,
                instance=instances[n] if instances else None,
            )
            for n, m in enumerate(ids)
        }
        assert all(s and s[-1].error is None for s in syncs.values()), syncs
        return ids, generation
