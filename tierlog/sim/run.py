"""One simulated run: a cluster, a workload, a seeded fault schedule, then healing and the final checks.

    result = simulate(seed=7)
    assert not result.violations, result.report()

Everything random (network conditions, fault times and targets, client choices) comes from the seed's one
`random.Random`, so the same seed replays the same run event for event; `fingerprint` proves it.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.errors import ControllerError
from tierlog.controller.metadata_log import QuorumMetadataLog
from tierlog.metadata.image import ClusterMetadata
from tierlog.raft.raft_client import RaftConfig
from tierlog.replication.partition import Partition
from tierlog.sim.broker_node import BrokerSettings, SimBroker
from tierlog.sim.clients import (
    READ_COMMITTED,
    SimConsumer,
    SimProducer,
    SimReadCommittedConsumer,
    SimTransactionalWriter,
    read_committed_records,
)
from tierlog.sim.controller_node import CONTROLLER_ID_BASE, SimController, active_controller
from tierlog.sim.invariants import COMMITTED_CHECK_INTERVAL_MS, ClusterChecker, History, QuorumChecker, log_markers
from tierlog.sim.world import Network, NetworkConditions, Node, Simulation

START_MS = 1_700_000_000_000
TOPIC = "sim"
REPLICATION_FACTOR = 3
CLUSTER_ID = "c2ltdWxhdGVkLWNsdXN0ZXI"
CONVERGENCE_CHECK_INTERVAL_MS = 500


@dataclass(frozen=True, slots=True)
class SimConfig:
    # Voters of the controller quorum (controller.quorum.voters): 1, 3 or 5.
    controllers: int = 3
    brokers: int = 3
    partitions: int = 2
    # Partitions are moved between brokers while the faults strike (AlterPartitionReassignments, KIP-455), and
    # some moves cancelled; with more brokers than REPLICATION_FACTOR a move adds and removes replicas.
    reassignments: bool = False
    producers: int = 3
    consumers: int = 1
    # Transactional writers (a transactional producer and its coordinator's markers) and a read_committed consumer
    # join the clients (docs/simulation.md#transactions).
    transactions: bool = False
    transactional_writers: int = 2
    # Virtual time with clients and faults, then at most this long for the healed cluster to converge.
    workload_ms: int = 40_000
    converge_ms: int = 120_000
    faults: bool = True
    segment_bytes: int = 2048
    # leader.imbalance.check.interval.seconds, short so that leaders move back to their preferred replicas
    # (auto.leader.rebalance.enable) several times a run, between and during faults.
    leader_imbalance_check_interval_ms: int = 3000


@dataclass(slots=True)
class RunResult:
    seed: int
    violations: list[str]
    scenario: str
    faults: list[str]
    acknowledged: int
    reads: int
    events: int
    virtual_ms: int
    fingerprint: str
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        lines = [
            f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} - {self.scenario}; {len(self.faults)} faults, "
            f"{self.acknowledged} acknowledged writes, {self.reads} records read, {self.events} events, "
            f"{self.virtual_ms / 1000:.0f} s virtual; fingerprint {self.fingerprint}"
        ]
        if not self.ok:
            lines.append("faults:")
            lines.extend(f"  {fault}" for fault in self.faults)
            lines.append("violations:")
            lines.extend(f"  {violation}" for violation in self.violations[:20])
            if len(self.violations) > 20:
                lines.append(f"  ... and {len(self.violations) - 20} more")
        return "\n".join(lines)


class _ErrorLogRecorder(logging.Handler):
    """A broker that logs an error (an unexpected exception) has a bug: each one fails the run."""

    def __init__(self, history: History) -> None:
        super().__init__(logging.ERROR)
        self._history = history

    def emit(self, record: logging.LogRecord) -> None:
        detail = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            detail += f": {record.exc_info[1]!r}"
        self._history.violation("a broker logged an error", f"{record.name}: {detail}")


class Cluster:
    def __init__(self, seed: int, config: SimConfig, root: Path) -> None:
        self.config = config
        self.sim = Simulation(seed, START_MS)
        rng = self.sim.rng
        self.network = Network(
            self.sim,
            NetworkConditions(
                min_delay_ms=1,
                max_delay_ms=rng.choice([2, 10, 50]),
                drop=rng.choice([0.0, 0.0, 0.001, 0.01]),
                duplicate=rng.choice([0.0, 0.01]),
            ),
        )
        self.history = History()
        self.checker = ClusterChecker(self.history)
        raft_config = RaftConfig()
        self.quorum_checker = QuorumChecker(self.history, liveness_bound_ms(raft_config))
        self.controllers: dict[int, SimController] = {}
        for node_id in range(CONTROLLER_ID_BASE + 1, CONTROLLER_ID_BASE + config.controllers + 1):
            self.controllers[node_id] = SimController(
                self.sim,
                self.network,
                node_id,
                self.controllers,
                root / f"controller-{node_id}",
                ControllerConfig(
                    session_timeout_ms=9000,
                    leader_imbalance_check_interval_ms=config.leader_imbalance_check_interval_ms,
                ),
                raft_config,
                CLUSTER_ID,
            )
        self.brokers: dict[int, SimBroker] = {}
        for broker_id in range(1, config.brokers + 1):
            self.brokers[broker_id] = SimBroker(
                self.sim,
                self.network,
                broker_id,
                root / f"broker-{broker_id}",
                self.controllers,
                self.brokers,
                BrokerSettings(),
                {},
                self.quorum_checker,
            )
        self.partitions = [TopicPartition(TOPIC, p) for p in range(config.partitions)]
        # Every other producer is idempotent, the first one of them included.
        self.producers = [
            SimProducer(
                self.sim,
                self.network,
                f"{'idempotent' if i % 2 else 'plain'}-producer-{i}",
                self.brokers,
                self.partitions,
                self.history,
                self.controllers if i % 2 else None,
            )
            for i in range(1, config.producers + 1)
        ]
        self.consumers = [
            SimConsumer(self.sim, self.network, f"consumer-{i}", self.brokers, self.partitions, self.history)
            for i in range(1, config.consumers + 1)
        ]
        self.txn_writers: list[SimTransactionalWriter] = []
        if config.transactions:
            self.txn_writers = [
                SimTransactionalWriter(
                    self.sim,
                    self.network,
                    f"transactional-writer-{i}",
                    self.brokers,
                    self.partitions,
                    self.history,
                    self.controllers,
                )
                for i in range(1, config.transactional_writers + 1)
            ]
            self.producers.extend(self.txn_writers)
            self.consumers.append(
                SimReadCommittedConsumer(
                    self.sim, self.network, "read-committed-consumer-1", self.brokers, self.partitions, self.history
                )
            )
        self.faults: list[str] = []
        # Set by a power loss until the cluster is whole again: no other fault strikes meanwhile.
        self.recovering_from_power_loss = False
        self.reassignments_accepted = 0

    @property
    def scenario(self) -> str:
        c = self.network.conditions
        return f"delay 1-{c.max_delay_ms} ms, drop {c.drop:.1%}, duplicate {c.duplicate:.0%}"

    @property
    def nodes(self) -> list[Node]:
        return [*self.controllers.values(), *self.brokers.values(), *self.producers, *self.consumers]

    @property
    def controller(self) -> Controller | None:
        """The active controller (of the newest epoch), None while there is none."""
        node = active_controller(self.controllers)
        return node.controller if node is not None else None

    def note(self, what: str) -> None:
        self.faults.append(f"t={(self.sim.now - START_MS) / 1000:7.3f}s {what}")

    # Checks

    def after_step(self) -> None:
        self.history.now_ms = self.sim.now - START_MS
        for broker in self.brokers.values():
            rm = broker.replica_manager
            if broker.up and rm is not None:
                for partition in rm.partitions.values():
                    self.checker.check_partition_step(broker.broker_id, broker.incarnation, partition)
        for voter in self.controllers.values():
            raft = voter.raft
            if voter.up and raft is not None:
                self.quorum_checker.check_voter_step(
                    voter.node_id, voter.incarnation, raft.epoch, raft.is_leader, raft.high_watermark
                )
        node = active_controller(self.controllers)
        # Only a wholly committed image (a record the controller applied at once may be lost with its leadership,
        # and no broker ever sees it) of the newest epoch ever led (a deposed leader that has not noticed yet
        # shows a stale one).
        if (
            node is not None
            and node.controller is not None
            and node.raft is not None
            and node.raft.high_watermark == node.raft.log.end_offset
            and node.raft.epoch == max(self.quorum_checker.leaders, default=node.raft.epoch)
        ):
            topic = node.controller.metadata.topics.get(TOPIC)
            if topic is not None:
                for index, registration in enumerate(topic.partitions):
                    self.checker.check_controller_step(
                        TopicPartition(TOPIC, index), registration.leader, registration.leader_epoch
                    )

    def check_committed(self) -> None:
        for broker in self.brokers.values():
            rm = broker.replica_manager
            if broker.up and rm is not None:
                for partition in rm.partitions.values():
                    self.checker.check_committed(broker.broker_id, broker.incarnation, partition)
        for voter in self.controllers.values():
            if voter.up and voter.raft is not None:
                self.quorum_checker.check_voter_log(
                    voter.node_id, voter.incarnation, voter.raft.log, voter.raft.high_watermark
                )
                self.quorum_checker.check_voter_snapshot(voter.node_id, voter.raft.log)
        majorities = self.connected_majorities()
        self.quorum_checker.check_liveness(
            self.sim.now,
            bool(majorities),
            any(v.raft is not None and v.raft.is_active_leader() for group in majorities for v in group),
        )
        self.sim.after(COMMITTED_CHECK_INTERVAL_MS, self.check_committed)

    def connected_majorities(self) -> list[tuple[SimController, ...]]:
        """Every majority of voters that are up, running and linked both ways to one another (a one-way cut may
        leave two overlapping ones; the leader may be in either)."""
        running = [v for v in self.controllers.values() if v.up and not v.paused]
        return [
            group
            for group in itertools.combinations(running, len(self.controllers) // 2 + 1)
            if not any((a.name, b.name) in self.network.cut for a in group for b in group if a is not b)
        ]

    def quorum_converged(self) -> bool:
        """Every voter up, with the active leader's log and high watermark, and every broker's metadata fetched to
        that end (a broker that is merely behind is still a prefix of the committed log, but the final checks
        compare whole images)."""
        node = active_controller(self.controllers)
        if node is None or node.raft is None:
            return False
        end = node.raft.log.end_offset
        return (
            node.raft.high_watermark == end
            and all(
                v.up and v.raft is not None and v.raft.log.end_offset == end and v.raft.high_watermark == end
                for v in self.controllers.values()
            )
            and all(b.up and b.loader.fetch_offset >= end for b in self.brokers.values())
        )

    def converged(self) -> bool:
        controller = self.controller
        if controller is None or not self.quorum_converged():
            return False
        topic = controller.metadata.topics.get(TOPIC)
        if topic is None:
            return False
        for index, registration in enumerate(topic.partitions):
            tp = TopicPartition(TOPIC, index)
            if registration.is_reassigning:
                return False
            if registration.leader < 0 or sorted(registration.isr) != sorted(registration.replicas):
                return False
            leader = self._replica(registration.leader, tp)
            if leader is None or not leader.is_leader or leader.leader_epoch != registration.leader_epoch:
                return False
            end = leader.log.log_end_offset
            if leader.log.high_watermark != end or sorted(leader.isr) != sorted(registration.replicas):
                return False
            for replica_id in registration.replicas:
                replica = self._replica(replica_id, tp)
                if replica is None or replica.log.log_end_offset != end or replica.log.high_watermark != end:
                    return False
        return True

    def balanced(self) -> bool:
        """Every partition led by its preferred replica, as the controller's balancing passes leave a healed
        cluster (auto.leader.rebalance.enable)."""
        controller = self.controller
        return controller is not None and not controller.partition_leaders_imbalanced()

    def _replica(self, broker_id: int, tp: TopicPartition):  # type: ignore[no-untyped-def]
        broker = self.brokers.get(broker_id)
        if broker is None or not broker.up or broker.replica_manager is None:
            return None
        return broker.replica_manager.partitions.get(tp)

    def describe(self) -> str:
        """Each partition as the controller and each replica see it, for a run that did not converge."""
        lines = [
            f"{v.name}: {v.raft.state_name} epoch {v.raft.epoch} leader {v.raft.leader_id} "
            f"LEO {v.raft.log.end_offset} HW {v.raft.high_watermark}"
            for v in self.controllers.values()
            if v.up and v.raft is not None
        ]
        controller = self.controller
        if controller is not None and TOPIC in controller.metadata.topics:
            for index, r in enumerate(controller.metadata.topics[TOPIC].partitions):
                lines.append(f"{TOPIC}-{index}: leader {r.leader} epoch {r.leader_epoch} isr {r.isr}")
        for broker in self.brokers.values():
            rm = broker.replica_manager
            for partition in rm.partitions.values() if rm is not None else ():
                log = partition.log
                epochs = [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.epoch_entries()]
                lines.append(
                    f"  broker {broker.broker_id} {partition.topic_partition}: leader {partition.leader_id} "
                    f"epoch {partition.leader_epoch} isr {partition.isr} LEO {log.log_end_offset} "
                    f"HW {log.high_watermark} epochs {epochs}"
                )
        return "; ".join(lines)

    def final_checks(self) -> None:
        node = active_controller(self.controllers)
        assert node is not None and node.controller is not None and node.raft is not None
        controller = node.controller
        self.quorum_checker.check_converged(
            node.node_id, {v.node_id: v.raft.log for v in self.controllers.values() if v.raft is not None}
        )
        # After convergence every voter's log is committed to its end; it starts at the leader's latest snapshot.
        metadata_log = QuorumMetadataLog(node.raft, on_append=lambda: None)
        snapshot = metadata_log.latest_snapshot()
        base = (
            ClusterMetadata()
            if snapshot is None
            else ClusterMetadata.from_snapshot(snapshot.records, snapshot.end_offset)
        )
        committed_records = metadata_log.records_from(node.raft.log.start_offset)
        for broker in self.brokers.values():
            self.quorum_checker.check_final_image(broker.name, broker.loader.image, base, committed_records)
        for voter in self.controllers.values():
            if voter.snapshotter is not None:
                self.quorum_checker.check_final_image(voter.name, voter.snapshotter.image, base, committed_records)
        topic = controller.metadata.topics[TOPIC]
        for index, registration in enumerate(topic.partitions):
            tp = TopicPartition(TOPIC, index)
            leader = self._replica(registration.leader, tp)
            assert leader is not None
            followers = [self._replica(b, tp) for b in registration.replicas if b != registration.leader]
            self.checker.check_converged(tp, leader, [f for f in followers if f is not None])
            for broker in self.brokers.values():
                if broker.broker_id not in registration.replicas:
                    self.checker.check_no_replica(broker.broker_id, tp, broker.replica_manager)
            if self.config.transactions:
                read = read_committed_log(leader)
                replicas = [f for f in followers if f is not None]
                self.checker.check_transactions_converged(tp, leader, replicas, read, log_markers(leader.log))

    def transactions_done(self) -> bool:
        """Every transactional writer stopped with its last transaction ended (every marker acknowledged)."""
        return all(writer.done for writer in self.txn_writers)

    # Faults

    def healthy(self) -> bool:
        """Every node up and reachable and every ISR whole. Only then may a power loss strike, and nothing else
        until the cluster is whole again: Kafka does not fsync, so acknowledged writes survive a power loss
        only while the other replicas keep them. (Without that rule seed 40 lost acknowledged writes: the
        powerless leader stayed in the ISR until its session expired, the other replicas were fenced
        meanwhile, and it came back as the last ISR member with a truncated log, KIP-966's case.)"""
        if self.network.cut or any(not n.up or n.paused for n in self.nodes):
            return False
        return self.converged()

    def schedule_faults(self, until_ms: int) -> None:
        rng = self.sim.rng

        def next_fault() -> None:
            if self.sim.now >= until_ms:
                return
            if self.recovering_from_power_loss and self.healthy():
                self.recovering_from_power_loss = False
            if not self.recovering_from_power_loss:
                self.inject(rng.choice(FAULTS))
            self.sim.after(rng.randint(1000, 6000), next_fault)

        self.sim.after(rng.randint(1000, 4000), next_fault)

    def inject(self, fault: str) -> None:
        rng = self.sim.rng
        broker = self.brokers[rng.choice(sorted(self.brokers))]
        voter = self.controllers[rng.choice(sorted(self.controllers))]
        other_voters = [self.controllers[i] for i in sorted(self.controllers) if i != voter.node_id]
        duration = rng.choice([rng.randint(200, 3000), rng.randint(3000, 15_000)])
        if fault == "kill" and broker.up:
            self.note(f"kill -9 {broker.name} for {duration} ms")
            broker.crash()
            self.sim.after(duration, lambda: self.restart(broker))
        elif fault == "power-loss" and broker.up:
            if self.healthy():
                self.recovering_from_power_loss = True
                cuts = broker.lose_power()
                self.note(f"power loss {broker.name} for {duration} ms ({'; '.join(cuts) or 'nothing unflushed'})")
                self.sim.after(duration, lambda: self.restart(broker))
        elif fault == "pause" and broker.up and not broker.paused:
            self.note(f"SIGSTOP {broker.name} for {duration} ms")
            broker.pause()
            self.sim.after(duration, lambda: self.resume(broker))
        elif fault == "isolate":
            others = [n.name for n in self.nodes if n is not broker]
            links = [(broker.name, o) for o in others] + [(o, broker.name) for o in others]
            self.cut(f"isolate {broker.name} from everyone", links, duration)
        elif fault == "cut-controller":
            links = [(broker.name, voter.name), (voter.name, broker.name)]
            self.cut(f"cut {broker.name} <-> {voter.name}", links, duration)
        elif fault == "cut-broker-link":
            other = self.brokers[rng.choice(sorted(set(self.brokers) - {broker.broker_id}))]
            links = [(broker.name, other.name), (other.name, broker.name)]
            self.cut(f"cut {broker.name} <-> {other.name}", links, duration)
        elif fault == "one-way-cut":
            other = self.brokers[rng.choice(sorted(set(self.brokers) - {broker.broker_id}))]
            self.cut(f"cut {broker.name} -> {other.name} (one way)", [(broker.name, other.name)], duration)
        elif fault == "pause-controller" and voter.up and not voter.paused:
            self.note(f"SIGSTOP {voter.name} for {duration} ms")
            voter.pause()
            self.sim.after(duration, lambda: self.resume(voter))
        elif fault == "kill-controller" and voter.up:
            self.note(f"kill -9 {voter.name} for {duration} ms")
            voter.crash()
            self.sim.after(duration, lambda: self.restart(voter))
        elif fault == "power-loss-controller" and voter.up:
            # A voter fsyncs its log on every append and its quorum-state before every vote: a power loss keeps
            # all it acted on, so unlike a broker's it needs no healthy cluster around it.
            self.note(f"power loss {voter.name} for {duration} ms (its log and quorum-state were fsynced)")
            voter.crash()
            self.sim.after(duration, lambda: self.restart(voter))
        elif fault == "isolate-controller":
            others = [n.name for n in self.nodes if n is not voter]
            links = [(voter.name, o) for o in others] + [(o, voter.name) for o in others]
            self.cut(f"isolate {voter.name} from everyone", links, duration)
        elif fault == "cut-controllers" and other_voters:
            other = rng.choice(other_voters)
            self.cut(
                f"cut {voter.name} <-> {other.name}", [(voter.name, other.name), (other.name, voter.name)], duration
            )
        elif fault == "one-way-cut-controllers" and other_voters:
            other = rng.choice(other_voters)
            self.cut(f"cut {voter.name} -> {other.name} (one way)", [(voter.name, other.name)], duration)

    def schedule_reassignments(self, until_ms: int) -> None:
        """Every 1-6 s until `until_ms`, one partition moved to random brokers (in a random order: the first is
        its new preferred leader), or one in three times its move cancelled, through whichever controller is
        active then (none: the admin's request is lost, as its NOT_CONTROLLER would say)."""
        rng = self.sim.rng

        def next_move() -> None:
            if self.sim.now >= until_ms:
                return
            tp = rng.choice(self.partitions)
            target = None if rng.random() < 1 / 3 else rng.sample(sorted(self.brokers), REPLICATION_FACTOR)
            active = active_controller(self.controllers)
            accepted = active is not None and active.reassign({tp: target})
            what = "cancel the move of" if target is None else "reassign"
            self.note(f"{what} {tp}{'' if target is None else f' to {target}'}{'' if accepted else ' (refused)'}")
            self.reassignments_accepted += accepted
            self.sim.after(rng.randint(1000, 6000), next_move)

        self.sim.after(rng.randint(1000, 4000), next_move)

    def cut(self, what: str, links: list[tuple[str, str]], duration: int) -> None:
        self.note(f"{what} for {duration} ms")
        self.network.cut_links(links)
        self.sim.after(duration, lambda: self.network.restore_links(links))

    def restart(self, node: Node) -> None:
        if not node.up:
            self.note(f"restart {node.name}")
            node.start()

    def resume(self, node: Node) -> None:
        if node.up and node.paused:
            self.note(f"SIGCONT {node.name}")
            node.resume()

    def heal(self) -> None:
        self.note("heal: every link restored, every node running, no more drops or duplicates")
        self.network.heal()
        self.network.conditions.drop = self.network.conditions.duplicate = 0.0
        for node in self.nodes:
            if not node.up:
                self.restart(node)
            elif node.paused:
                self.resume(node)


FAULTS = (
    "kill",
    "power-loss",
    "pause",
    "isolate",
    "cut-controller",
    "cut-broker-link",
    "one-way-cut",
    "kill-controller",
    "pause-controller",
    "power-loss-controller",
    "isolate-controller",
    "cut-controllers",
    "one-way-cut-controllers",
)


def liveness_bound_ms(config: RaftConfig) -> int:
    """How soon a majority of voters, up and connected, must have an active leader: a follower notices a silent
    leader within the fetch timeout, an election (pre-vote and vote) takes up to two election timeouts, a lost one
    backs off; twice that for drops and an election lost to a split vote."""
    return 2 * (config.fetch_timeout_ms + 2 * config.election_timeout_ms + config.election_backoff_max_ms)


def simulate(seed: int, config: SimConfig = SimConfig(), *, keep_dir: Path | None = None) -> RunResult:
    root = keep_dir if keep_dir is not None else Path(tempfile.mkdtemp(prefix="tierlog-sim-", dir=_scratch()))
    logger = logging.getLogger("tierlog")
    cluster: Cluster | None = None
    recorder: _ErrorLogRecorder | None = None
    try:
        cluster = Cluster(seed, config, root)
        recorder = _ErrorLogRecorder(cluster.history)
        logger.addHandler(recorder)
        try:
            _run(cluster)
        except ValueError as e:
            # A node's image refusing a record of its committed log (ClusterMetadata.apply): what it had folded
            # as committed was not, or changed since. The run ends there, failed.
            cluster.history.violation("committed metadata changed", f"a node cannot apply its committed log: {e}")
        return _result(seed, cluster)
    finally:
        if recorder is not None:
            logger.removeHandler(recorder)
        if cluster is not None:
            for node in cluster.nodes:
                if node.up:
                    node.crash()
        if keep_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _run(cluster: Cluster) -> None:
    sim, config, history = cluster.sim, cluster.config, cluster.history
    for node in [*cluster.controllers.values(), *cluster.brokers.values()]:
        node.start()
    step = cluster.after_step
    _run_until(sim, lambda: all(not b.fenced for b in cluster.brokers.values()), 30_000, step)
    configs = {"min.insync.replicas": "2", "segment.bytes": str(config.segment_bytes)}

    def topic_created() -> bool:
        """The set-up's CreateTopics, as an admin client retries it: sent to the active controller until the topic
        is committed (a leadership change before the commit loses it, as the client's NOT_CONTROLLER says; a broker
        fenced meanwhile leaves too few to place it, and the run's exploration must not end there)."""
        active = active_controller(cluster.controllers)
        if active is None or active.controller is None or active.snapshotter is None:
            return False
        if TOPIC in active.snapshotter.image.topics:
            return True
        if TOPIC not in active.controller.metadata.topics:
            # A broker fenced meanwhile (a lost heartbeat) leaves too few to place the replicas: asked again.
            with contextlib.suppress(ControllerError):
                active.create_topic(TOPIC, config.partitions, REPLICATION_FACTOR, configs)
        return False

    if not _run_until(sim, topic_created, 30_000, step):
        history.violation("no topic", "not committed 30 s after the cluster started, without faults")
        return
    sim.after(COMMITTED_CHECK_INTERVAL_MS, cluster.check_committed)
    for client in [*cluster.producers, *cluster.consumers]:
        client.start()
    workload_end = sim.now + config.workload_ms
    if config.faults:
        cluster.schedule_faults(workload_end)
    if config.reassignments:
        cluster.schedule_reassignments(workload_end)
    sim.run_until(workload_end, step)
    for producer in cluster.producers:
        producer.running = False
    cluster.heal()
    if not _run_until(
        sim,
        lambda: cluster.transactions_done() and cluster.converged() and cluster.balanced(),
        config.converge_ms,
        step,
    ):
        history.violation("no convergence", f"{config.converge_ms} ms after healing: {cluster.describe()}")
        return
    cluster.final_checks()


def _run_until(sim: Simulation, condition: Callable[[], bool], limit_ms: int, step: Callable[[], None]) -> bool:
    deadline = sim.now + limit_ms
    while sim.now < deadline:
        if condition():
            return True
        sim.run_until(min(deadline, sim.now + CONVERGENCE_CHECK_INTERVAL_MS), step)
    return condition()


def _result(seed: int, cluster: Cluster) -> RunResult:
    history = cluster.history
    violations = [str(v) for v in history.violations]
    digest = hashlib.sha256()
    for item in (cluster.faults, sorted((str(k), v) for k, v in history.acked.items()), violations, cluster.sim.steps):
        digest.update(repr(item).encode())
    return RunResult(
        seed=seed,
        violations=violations,
        scenario=cluster.scenario,
        faults=cluster.faults,
        acknowledged=len(history.acked),
        reads=history.read_count,
        events=cluster.sim.steps,
        virtual_ms=cluster.sim.now - START_MS,
        fingerprint=digest.hexdigest()[:16],
        stats={
            "messages": cluster.network.sent,
            "dropped": cluster.network.dropped,
            "duplicated": cluster.network.duplicated,
            "leaders balanced": sum(v.leaders_balanced for v in cluster.controllers.values()),
            "controller epochs": len(cluster.quorum_checker.leaders),
            "reassignments": cluster.reassignments_accepted,
            "transactions committed": sum(w.committed for w in cluster.txn_writers),
            "transactions aborted": sum(w.aborted for w in cluster.txn_writers),
        },
    )


def read_committed_log(partition: Partition) -> list[tuple[int, str]]:
    """(offset, value) of every record a read_committed consumer reading the leader `partition` from its log
    start is handed: the core's read_committed reads, filtered as Kafka's consumer filters them."""
    records: list[tuple[int, str]] = []
    offset = partition.log.log_start_offset
    while offset < partition.log.last_stable_offset:
        read = partition.read_records(
            offset, 1 << 20, isolation_level=READ_COMMITTED, min_one_message=True, current_leader_epoch=-1
        )
        data = read.records.read_bytes() if read.records is not None else b""
        taken = read_committed_records(bytes(data), offset, read.aborted_transactions or ())
        records.extend(taken.records)
        if taken.next_offset <= offset:
            break
        offset = taken.next_offset
    return records


def _scratch() -> str | None:
    """Simulated disks live in memory where the machine has a tmpfs: the run is bound by CPU, not fsync."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
