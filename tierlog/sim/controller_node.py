"""A controller as a simulated node: one voter of the KRaft quorum (docs/quorum.md), the real `RaftClient` over a
real `RaftLog` and quorum-state file on the simulated disk, and the real `Controller` while this voter is the
active leader.

The node is the Raft core's world: it carries the core's requests (`poll`) to the other voters over the
simulated network and their responses back (`on_response`, None when none came within
controller.quorum.request.timeout.ms), hands the requests it receives to the core's `handle_*` (a Fetch is
answered through its callback, at once or when records come), and polls the core when it asks to be woken
(`next_wakeup_ms`) and after every message.

Like a running node's shell, every voter runs the `MetadataSnapshotter` after the core's events, with a small
byte threshold so that snapshots are written, logs start later and voters and brokers catch up from snapshots
within a run (docs/quorum.md#snapshots).

The `Controller` exists only while the core says this voter is the active leader (its epoch's
LeaderChangeMessage committed): it is built by replaying the committed log and appends through
`RaftClient.append`; it is thrown away the moment leadership is lost. A broker's request is answered only once
every record the answer may rest on is committed, NOT_CONTROLLER otherwise (docs/quorum.md). A crash loses the
session deadlines, the pending answers and the balancing pass; the Raft log and the quorum-state file are
fsynced on every write, so a restart, even after a power loss, finds everything the voter acted on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.errors import ControllerError, NotControllerError
from tierlog.controller.metadata_log import QuorumMetadataLog
from tierlog.controller.metadata_snapshots import MetadataSnapshotter, SnapshotConfig
from tierlog.metadata.lifecycle import BrokerHeartbeatRequest, BrokerRegistrationRequest
from tierlog.raft.messages import (
    Outbound,
    RaftRequest,
)
from tierlog.raft.quorum_state import QUORUM_STATE_FILE, FileQuorumStateStore
from tierlog.raft.raft_client import RaftClient, RaftConfig
from tierlog.raft.raft_log import RaftLog
from tierlog.replication.alter_partition_manager import AlterPartitionAnswer, AlterPartitionRequest
from tierlog.sim.world import Network, Node, Respond, Simulation

FENCE_CHECK_INTERVAL_MS = 100
# Node ids of the simulated voters are CONTROLLER_ID_BASE + 1, + 2, ...: apart from the brokers' 1, 2, 3, whose
# ids are their replica ids when they fetch the metadata as observers.
CONTROLLER_ID_BASE = 3000
NOT_CONTROLLER = "NOT_CONTROLLER"
# How long an answer waits for its records to commit; the broker gives up on it at its own request timeout.
COMMIT_WAIT_MS = 5000
# metadata.log.max.record.bytes.between.snapshots of the simulated voters: a few dozen of a run's records, so that
# every run snapshots; no time-based snapshots (the runs are a minute of virtual time).
SNAPSHOT_CONFIG = SnapshotConfig(max_bytes_between_snapshots=4096, max_interval_ms=0)


class SimController(Node):
    def __init__(
        self,
        sim: Simulation,
        network: Network,
        node_id: int,
        voters: dict[int, SimController],
        data_dir: Path,
        config: ControllerConfig,
        raft_config: RaftConfig,
        cluster_id: str,
    ) -> None:
        super().__init__(sim, f"controller-{node_id}")
        self.node_id = node_id
        self._network = network
        self._voters = voters
        self.data_dir = data_dir
        self._config = config
        self.raft_config = raft_config
        self._cluster_id = cluster_id
        # The core's own stream (election timeouts, backoffs), so its draws never shift the fault schedule.
        self._rng = random.Random(f"{sim.seed}/raft/{node_id}")
        self.raft: RaftClient | None = None
        self.controller: Controller | None = None
        # The committed log folded, snapshotted when due; made at each start.
        self.snapshotter: MetadataSnapshotter | None = None
        # The epoch the controller leads in: it must not outlive it, even across a quick loss and regain.
        self._controller_epoch = -1
        # When the earliest timer armed for the core's next wakeup fires.
        self._armed_wakeup_ms: int | None = None
        # The due time of the balancing pass a timer is armed for, so each pass gets one timer.
        self._armed_balance_ms: int | None = None
        # Leaders the balancing passes moved back to their preferred replicas, over every incarnation.
        self.leaders_balanced = 0

    # Life cycle

    def on_start(self) -> None:
        self.raft = RaftClient(
            self.node_id,
            sorted(self._voters),
            RaftLog(self.data_dir, self.sim.now),
            FileQuorumStateStore(self.data_dir / QUORUM_STATE_FILE, frozenset(self._voters)),
            self.raft_config,
            self.sim.now,
            self._rng,
        )
        self.snapshotter = MetadataSnapshotter(self.raft, SNAPSHOT_CONFIG, self.sim.now)
        self._armed_wakeup_ms = None
        self.every(FENCE_CHECK_INTERVAL_MS, self._fence_stale_brokers)
        self._step()

    def on_crash(self) -> None:
        """SIGKILL or power loss: every write of the Raft log and of the quorum-state file was fsynced before the
        voter acted on it, so the disk keeps all of it; only the process's memory is gone."""
        if self.raft is not None:
            self.raft.log.close()
        self.raft = None
        self.controller = None
        self.snapshotter = None
        self._armed_balance_ms = None

    @property
    def is_active(self) -> bool:
        """Whether this voter is up and runs the active controller (in its own view: a deposed leader that has not
        heard of its successor still thinks so until its check-quorum timeout)."""
        return self.up and self.controller is not None

    # Driving the Raft core

    def _step(self) -> None:
        """Poll the core: send what it asks to send, follow its leadership, arm a timer for its next wakeup."""
        raft = self.raft
        assert raft is not None
        for outbound in raft.poll(self.sim.now):
            self._send(raft, outbound)
        assert self.snapshotter is not None
        self.snapshotter.poll(self.sim.now)
        self._follow_leadership(raft)
        wakeup = max(raft.next_wakeup_ms(), self.sim.now + 1)
        if self._armed_wakeup_ms is None or wakeup < self._armed_wakeup_ms:
            self._armed_wakeup_ms = wakeup
            self.after(wakeup - self.sim.now, lambda: self._wake(wakeup))

    def _wake(self, armed_for: int) -> None:
        if self._armed_wakeup_ms != armed_for:
            return  # superseded by an earlier wakeup, which armed the next one
        self._armed_wakeup_ms = None
        self._step()

    def _send(self, raft: RaftClient, outbound: Outbound) -> None:
        peer = self._voters[outbound.destination]
        request = outbound.request

        def on_reply(response: object) -> None:
            raft.on_response(outbound.destination, request, response, self.sim.now)  # type: ignore[arg-type]
            self._step()

        def on_failure() -> None:
            raft.on_response(outbound.destination, request, None, self.sim.now)
            self._step()

        self._network.call(
            self,
            peer,
            lambda respond: peer.handle_raft(request, respond),
            on_reply,
            on_failure,
            self.raft_config.request_timeout_ms,
        )

    def handle_raft(self, request: RaftRequest, respond: Respond) -> None:
        """A Raft request from another voter, or a broker's metadata Fetch (an observer's)."""
        assert self.raft is not None
        self.raft.handle(request, self.sim.now, respond)
        self._step()

    def _follow_leadership(self, raft: RaftClient) -> None:
        """The Controller lives exactly as long as this voter is the active leader of one epoch."""
        if self.controller is not None and not (raft.is_active_leader() and raft.epoch == self._controller_epoch):
            self._drop_controller()
        if self.controller is None and raft.is_active_leader():
            self._controller_epoch = raft.epoch
            self.controller = Controller(
                QuorumMetadataLog(raft, on_append=lambda: None),
                self._config,
                self.sim.now,
                self._cluster_id,
                new_uuid=self.sim.new_uuid,
            )
            self._armed_balance_ms = None
            self._arm_leader_balance()

    def _drop_controller(self) -> None:
        self.controller = None
        self._armed_balance_ms = None

    # The active controller's timers

    def _fence_stale_brokers(self) -> None:
        if self.controller is not None:
            self._operate(lambda c: c.fence_stale_brokers(self.sim.now))

    def _arm_leader_balance(self) -> None:
        """After anything that may have changed the metadata: a timer for the controller's next balancing pass,
        if one is due and no timer waits for it yet (a due pass stays due until it runs)."""
        controller = self.controller
        if controller is None:
            return
        due = controller.next_leader_balance_ms()
        if due is None or due == self._armed_balance_ms:
            return
        self._armed_balance_ms = due
        self.after(due - self.sim.now, lambda: self._balance_leaders(controller))

    def _balance_leaders(self, controller: Controller) -> None:
        if self.controller is not controller:
            return  # the pass of a controller thrown away since
        self._armed_balance_ms = None
        self.leaders_balanced += self._operate(lambda c: c.balance_partition_leaders(self.sim.now)) or 0

    def _operate(self, operation: Callable[[Controller], int | list[int]]) -> int | None:
        """Run an operation nobody waits for on the active controller; None if it is no longer active."""
        assert self.controller is not None
        try:
            result = operation(self.controller)
        except NotControllerError:
            self._drop_controller()
            return None
        self._arm_leader_balance()
        self._step()
        return result if isinstance(result, int) else len(result)

    # Requests from brokers (each runs on this node when the message arrives)

    def _decide(self, respond: Respond, decision: Callable[[Controller], object]) -> None:
        """Answer with the controller's decision, or with the name of the error it refused the request with,
        once every record written so far is committed (the answer may rest on any of them); NOT_CONTROLLER if
        this voter is not, or stops being, the active controller before that."""
        controller = self.controller
        if controller is None:
            respond(NOT_CONTROLLER)
            return
        try:
            answer = decision(controller)
        except NotControllerError:
            self._drop_controller()
            respond(NOT_CONTROLLER)
            return
        except ControllerError as error:
            answer = error.error_name
        self._arm_leader_balance()
        self._answer_once_committed(respond, answer)

    def _answer_once_committed(self, respond: Respond, answer: object) -> None:
        raft = self.raft
        assert raft is not None
        epoch, last_offset = raft.epoch, raft.log.end_offset - 1

        def ready() -> None:
            high_watermark = raft.high_watermark
            committed = high_watermark is not None and high_watermark > last_offset
            if self.raft is raft and raft.is_leader and raft.epoch == epoch and committed:
                respond(answer)
            else:
                respond(NOT_CONTROLLER)

        raft.wait_for_commit(last_offset, COMMIT_WAIT_MS, self.sim.now, ready)
        self._step()

    def register(self, request: BrokerRegistrationRequest, respond: Respond) -> None:
        self._decide(
            respond,
            lambda c: c.register_broker(
                request.broker_id,
                str(request.incarnation_id),
                request.cluster_id,
                request.endpoints,
                request.rack,
                self.sim.now,
            ),
        )

    def heartbeat(self, request: BrokerHeartbeatRequest, respond: Respond) -> None:
        self._decide(
            respond,
            lambda c: c.heartbeat(
                request.broker_id,
                request.broker_epoch,
                request.current_metadata_offset,
                request.want_fence,
                request.want_shut_down,
                self.sim.now,
            ),
        )

    def alter_partition(self, request: AlterPartitionRequest, respond: Respond) -> None:
        """Every change of the request decided and committed together; answered by partition."""

        def decide(c: Controller) -> dict[TopicPartition, AlterPartitionAnswer]:
            outcomes = c.alter_partitions(
                request.broker_id, request.broker_epoch, [p.isr_change() for p in request.proposals]
            )
            return {
                p.topic_partition: AlterPartitionAnswer(None, outcome.error_name)
                if isinstance(outcome, ControllerError)
                else AlterPartitionAnswer(outcome, None)
                for p, outcome in zip(request.proposals, outcomes, strict=True)
            }

        self._decide(respond, decide)

    def allocate_producer_id(self, respond: Respond) -> None:
        """InitProducerId, as a broker would answer it from a block the controller handed out."""
        self._decide(respond, lambda c: c.allocate_producer_id_block().start)

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]) -> None:
        """An admin's CreateTopics, handed straight to the active controller (the run's set-up, not under test)."""
        assert self.controller is not None
        self.controller.create_topic(name, partitions, replication_factor, configs)
        self._arm_leader_balance()
        self._step()

    def reassign(self, targets: Mapping[TopicPartition, Sequence[int] | None]) -> bool:
        """An admin's AlterPartitionReassignments (None cancels), handed straight to the active controller: what
        is under test is how the controller and the brokers carry it out under the faults, not the admin's
        request (one lost with the controller's leadership is lost, as the admin's NOT_CONTROLLER says). True
        if the controller accepted every partition's change."""
        if self.controller is None:
            return False
        accepted = self._operate(
            lambda c: [tp for tp, error in c.alter_partition_reassignments(targets).items() if error is None]
        )
        return accepted == len(targets)


def active_controller(voters: dict[int, SimController]) -> SimController | None:
    """The simulator's truth: the voter running the controller in the newest epoch any running voter knows, None
    while there is none (a deposed leader may run one until it notices: it is not the truth once another voter
    has moved on)."""
    running = [v.raft for v in voters.values() if v.up and v.raft is not None]
    newest = max((raft.epoch for raft in running), default=-1)
    return next((v for v in voters.values() if v.is_active and v.raft is not None and v.raft.epoch == newest), None)


class ControllerGuess:
    """Which voter a broker (or a client) takes for the active controller, as Kafka's controller channel does: a
    leader named by a voter's answer (a Fetch response's leader id and epoch, Kafka's CurrentLeader) if newer
    than the one known, else, after a NOT_CONTROLLER or NOT_LEADER_OR_FOLLOWER answer or a timeout, the next
    voter in turn."""

    def __init__(self, voter_ids: Sequence[int]) -> None:
        self._voter_ids = sorted(voter_ids)
        self.current = self._voter_ids[0]
        self.leader_epoch = -1

    def hint(self, leader_id: int, leader_epoch: int) -> bool:
        """A voter's answer named `leader_id` the leader of `leader_epoch`: True if taken (not older than known)."""
        if leader_id not in self._voter_ids or leader_epoch < self.leader_epoch:
            return False
        self.current, self.leader_epoch = leader_id, leader_epoch
        return True

    def failed(self, tried: int) -> None:
        """`tried` did not answer as the active controller; another guess unless one was taken meanwhile."""
        if tried == self.current:
            self.current = self._voter_ids[(self._voter_ids.index(tried) + 1) % len(self._voter_ids)]
