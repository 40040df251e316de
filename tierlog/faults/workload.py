"""A fault run: a 3-broker ProxiedCluster (the brokers are the 3 voters of the controller quorum), producers and
consumers of confluent-kafka (librdkafka) recording a History, a seeded nemesis, healing, a final read, and the
checker's verdict.

    history, verdict = fault_run(Path("/tmp/run"), seconds=45, seed=7, say=print)

Faults (one at a time, 1-3 s apart, so never more than one voter at a time), each aimed at the active
controller (the leader DescribeQuorum names at that moment) or at any node, as the seed draws: SIGKILL then a
restart; SIGSTOP/SIGCONT (sometimes beyond the session and fetch timeouts, so the broker is fenced and the
quorum elects another leader); isolation from the quorum (every link to and from its controller listener cut,
"reset" or "blackhole": a leader resigns by check quorum, a broker is fenced while it still serves clients);
and, aimed at any node, a cut of its inter-broker listener, so nobody can fetch from it. Between and during
the faults the nemesis asks the voters for the quorum's leader and epoch (DescribeQuorum) and records each
change in the history: the elections the faults caused, and when they completed.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.faults.checker import History, Send, Timeline, Verdict, check
from tierlog.faults.cluster import ProxiedCluster, QuorumView
from tierlog.faults.proxy import CutMode, FaultProxy
from tierlog.testing.local_cluster import wait_until

TOPIC = "jepsen"
PARTITIONS = 3
OVERRIDES = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "5000",
    "replica.socket.timeout.ms": "5000",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "log.segment.bytes": str(64 * 1024),
}
SEND_INTERVAL_S = 0.01
# How often the nemesis asks the voters who leads the quorum.
QUORUM_POLL_S = 0.5
CONVERGE_S = 90.0
FLUSH_S = 60.0
FINAL_READ_S = 60.0


class ProducerThread(threading.Thread):
    def __init__(self, name: str, bootstrap: str, idempotent: bool, history: History, lock: threading.Lock) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self._history = history
        self._lock = lock
        self._idempotent = idempotent
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "log_level": 2,  # connection errors are the point of the run: keep them off stderr
                "acks": "all",
                "enable.idempotence": idempotent,
                # librdkafka 2.x may resend a possibly-written batch under a new producer epoch after an
                # OUT_OF_ORDER_SEQUENCE_NUMBER on a later in-flight request (librdkafka #4953), which no broker
                # can recognise as a retry: one request at a time keeps the history about the broker.
                "max.in.flight.requests.per.connection": 1 if idempotent else 5,
                "linger.ms": 5,
                "request.timeout.ms": 5000,
                "message.timeout.ms": 60_000,
                "retry.backoff.ms": 100,
                "reconnect.backoff.max.ms": 1000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )

    def run(self) -> None:
        seq = 0
        while not self.stopping.is_set():
            send = Send(f"{self.name}-{seq}", self._idempotent)
            seq += 1
            with self._lock:
                self._history.sends.append(send)
            try:
                self.producer.produce(TOPIC, send.value.encode(), on_delivery=_on_delivery(send))
            except BufferError:
                send.outcome = "failed"
            self.producer.poll(SEND_INTERVAL_S)
        self.producer.flush(FLUSH_S)


def _on_delivery(send: Send) -> Callable[[KafkaError | None, Message], None]:
    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            send.outcome = "failed"
            return
        send.outcome = "ok"
        send.partition = message.partition() or 0
        # librdkafka may confirm an idempotent batch without its offset (None), e.g. after retries of a
        # timed-out request: the value must then be in the log, at an offset the checker does not know.
        offset = message.offset()
        send.offset = -1 if offset is None else offset

    return delivered


class ConsumerThread(threading.Thread):
    """Assigned every partition from offset 0 (no group, no seeks): what it polls must be the log, in order."""

    def __init__(self, name: str, bootstrap: str, records: list[tuple[int, int, str]]) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.records = records
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "log_level": 2,  # connection errors are the point of the run: keep them off stderr
                "group.id": f"jepsen-{name}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.consumer.assign([KafkaTopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])

    def run(self) -> None:
        while not self.stopping.is_set():
            message = self.consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            value = message.value()
            self.records.append((message.partition() or 0, message.offset() or 0, (value or b"").decode()))
        self.consumer.close()


_NodeAction = Callable[[ProxiedCluster, int], object]
# The faults of a broker's process: the words noting it, how it is inflicted, the words noting its undoing, how
# it is undone, and the longest it is held (s).
_PROCESS_FAULTS: dict[str, tuple[str, _NodeAction, str, _NodeAction, float]] = {
    "kill": ("kill -9", ProxiedCluster.kill, "restart", ProxiedCluster.restart, 5.0),
    "pause": ("SIGSTOP", ProxiedCluster.pause, "SIGCONT", ProxiedCluster.resume, 8.0),
}
_CUT_MODES: tuple[CutMode, ...] = ("reset", "blackhole")
ACTIVE_CONTROLLER = "the active controller"


class Nemesis(threading.Thread):
    def __init__(
        self, cluster: ProxiedCluster, seed: int, history: Timeline, started: float, say: Callable[[str], None]
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._cluster = cluster
        self._rng = random.Random(seed)
        self._history = history
        self._t0 = started
        self._say = say
        self._quorum: QuorumView | None = None

    def note(self, what: str) -> None:
        at = time.monotonic() - self._t0
        self._history.faults.append((round(at, 2), what))
        self._say(f"  t={at:5.1f}s {what}")

    def run(self) -> None:
        try:
            self.watch_quorum()
            while not self._hold(self._rng.uniform(1.0, 3.0)):
                self._one_fault()
        except BaseException as error:  # reported by the caller, which heals the cluster either way
            self.error = error

    def _hold(self, seconds: float) -> bool:
        """Wait `seconds` (less if the run stops meanwhile: then True), watching the quorum."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self.stopping.wait(min(QUORUM_POLL_S, remaining)):
                return True
            self.watch_quorum()
        return self.stopping.is_set()

    def watch_quorum(self) -> QuorumView | None:
        """Ask the voters who leads (None: no voter claims to); record a new leader or epoch in the history."""
        view = self._cluster.quorum()
        if view is None or view == self._quorum:
            return view
        self._quorum = view
        at = time.monotonic() - self._t0
        self._history.quorum.append((round(at, 2), view.leader, view.epoch))
        self._say(f"  t={at:5.1f}s quorum: leader {view.leader}, epoch {view.epoch}")
        return view

    def _one_fault(self) -> None:
        rng, cluster = self._rng, self._cluster
        fault = rng.choice(["kill", "pause", "cut-replication", "isolate"])
        # Both drawn for every fault, so the schedule depends on the seed alone, not on who leads.
        aim_at_leader = rng.random() < 0.5
        node = rng.choice(cluster.node_ids)
        if fault == "cut-replication":
            link = f"fetches from broker {node}"
            self._cut_for_a_while([cluster.replication_proxy(node)], f"cut ({{mode}}) {link}", f"heal {link}")
            return
        target = f"broker {node}"
        # Aimed at the leader of this moment; with none (an election under way) at the node drawn.
        active = self.watch_quorum()
        if aim_at_leader and active is not None:
            node = active.leader
            target = f"broker {node} ({ACTIVE_CONTROLLER}, epoch {active.epoch})"
        if fault in _PROCESS_FAULTS:
            fault_words, inflict, heal_words, undo, longest_s = _PROCESS_FAULTS[fault]
            self._for_a_while(
                f"{fault_words} {target}",
                rng.uniform(0.5, longest_s),
                lambda: inflict(cluster, node),
                f"{heal_words} broker {node}",
                lambda: undo(cluster, node),
            )
        else:
            self._cut_for_a_while(
                cluster.quorum_links(node), f"isolate ({{mode}}) {target} from the quorum", f"rejoin broker {node}"
            )

    def _cut_for_a_while(self, proxies: list[FaultProxy], fault: str, heal: str) -> None:
        """Cut links ("reset" or "blackhole", drawn after the node, put in `fault` for {mode}) for 1 to 8 s, then
        heal them."""
        mode = self._rng.choice(_CUT_MODES)
        self._for_a_while(
            fault.format(mode=mode),
            self._rng.uniform(1.0, 8.0),
            lambda: [proxy.cut(mode) for proxy in proxies],
            heal,
            lambda: [proxy.heal() for proxy in proxies],
        )

    def _for_a_while(
        self, fault: str, seconds: float, inflict: Callable[[], object], heal: str, undo: Callable[[], object]
    ) -> None:
        """Inflict a fault, hold it `seconds` (less if the run stops meanwhile), then undo it; both noted."""
        self.note(f"{fault} for {seconds:.1f} s")
        inflict()
        self._hold(seconds)
        self.note(heal)
        undo()


def fault_run(
    base_dir: Path, seconds: float, seed: int, say: Callable[[str], None] = lambda _: None
) -> tuple[History, Verdict]:
    history = History()
    lock = threading.Lock()
    with ProxiedCluster(base_dir, 3, OVERRIDES) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])[TOPIC].result(30)
        wait_until(lambda: _converged(cluster), 30, "topic replicas to start", interval_s=0.5)
        producers = [ProducerThread(f"idempotent-{i}", cluster.bootstrap, True, history, lock) for i in (1, 2)] + [
            ProducerThread("plain-1", cluster.bootstrap, False, history, lock)
        ]
        consumers = []
        for i in (1, 2):
            history.polls[f"consumer-{i}"] = []
            consumers.append(ConsumerThread(f"consumer-{i}", cluster.bootstrap, history.polls[f"consumer-{i}"]))
        started = time.monotonic()
        nemesis = Nemesis(cluster, seed, history, started, say)
        for thread in [*producers, *consumers, nemesis]:
            thread.start()
        time.sleep(seconds)
        stop_and_heal(cluster, nemesis, say)
        for producer in producers:
            producer.stopping.set()
        for producer in producers:
            producer.join(FLUSH_S + 10)
        wait_until(
            lambda: _converged(cluster),
            CONVERGE_S,
            "every replica to catch up and every ISR to be whole",
            interval_s=0.5,
        )
        # The election a fault's last moments caused, seen now that it is over.
        nemesis.watch_quorum()
        history.final = _final_read(cluster.bootstrap)
        ends = {p: (records[-1][0] + 1 if records else 0) for p, records in history.final.items()}
        wait_until(
            lambda: all(_consumed(c.records, ends) for c in consumers),
            30,
            "consumers to reach the log end",
            interval_s=0.5,
        )
        for consumer in consumers:
            consumer.stopping.set()
            consumer.join(30)
    for line in controller_failovers(history):
        say(f"  failover: {line}")
    return history, check(history)


def stop_and_heal(cluster: ProxiedCluster, nemesis: Nemesis, say: Callable[[str], None]) -> None:
    """Stop the nemesis, restore every link and have every broker running; raise what the nemesis failed with."""
    nemesis.stopping.set()
    nemesis.join(120)
    say("  healing: every link restored, every broker running")
    cluster.heal_network()
    for node in cluster.node_ids:
        broker = cluster.broker(node)
        if broker.paused:
            cluster.resume(node)
        if not broker.running:
            cluster.restart(node)
    if nemesis.error is not None:
        raise RuntimeError(f"the nemesis failed: {nemesis.error!r}") from nemesis.error


def controller_failovers(history: Timeline) -> list[str]:
    """One line per fault aimed at the active controller: the leader and epoch before it, and the first new ones
    DescribeQuorum showed before the next fault (the election it caused, and when it completed), or none."""
    lines = []
    # The nemesis notes each fault, then its undoing: faults are the even entries.
    for index in range(0, len(history.faults), 2):
        at, fault = history.faults[index]
        if ACTIVE_CONTROLLER not in fault:
            continue
        healed_at = history.faults[index + 1][0] if index + 1 < len(history.faults) else float("inf")
        until = history.faults[index + 2][0] if index + 2 < len(history.faults) else float("inf")
        before = [(leader, epoch) for seen, leader, epoch in history.quorum if seen <= at]
        after = [entry for entry in history.quorum if at < entry[0] <= until]
        outcome = "no new leader or epoch seen before the next fault"
        if after:
            seen, leader, epoch = after[0]
            when = "during the fault" if seen <= healed_at else "after its undoing"
            outcome = f"leader {leader}, epoch {epoch} seen {seen - at:.1f} s later, {when}"
        was = f"leader {before[-1][0]}, epoch {before[-1][1]}" if before else "no leader seen"
        lines.append(f"t={at:.1f}s {fault}: {was} -> {outcome}")
    return lines


def _consumed(records: list[tuple[int, int, str]], ends: dict[int, int]) -> bool:
    last: dict[int, int] = {}
    for partition, offset, _ in list(records):
        last[partition] = offset
    return all(last.get(p, -1) + 1 >= end for p, end in ends.items() if end > 0)


def _converged(cluster: ProxiedCluster) -> bool:
    return converged(cluster, {TOPIC: PARTITIONS})


def converged(cluster: ProxiedCluster, topics: Mapping[str, int]) -> bool:
    """Every broker reports every partition of `topics` (name -> partitions) with its replica at one LEO equal to
    the HW, and each leader's ISR whole."""
    views: list[dict[str, Any]] = []
    for node in cluster.node_ids:
        try:
            with urllib.request.urlopen(f"http://{cluster.http_address(node)}/v1/partitions", timeout=5) as r:
                views.extend(p for p in json.loads(r.read())["partitions"] if p["topic"] in topics)
        except (OSError, ValueError):
            return False
    for topic, partition in ((topic, p) for topic, count in topics.items() for p in range(count)):
        replicas = [v for v in views if v["topic"] == topic and v["partition"] == partition]
        leaders = [v for v in replicas if v["role"] == "leader"]
        if len(replicas) != 3 or len(leaders) != 1 or len(leaders[0]["isr"]) != 3:
            return False
        ends = {(v["log_end_offset"], v["high_watermark"]) for v in replicas}
        if len(ends) != 1 or len({e for pair in ends for e in pair}) != 1:
            return False
    return True


def _final_read(bootstrap: str) -> dict[int, list[tuple[int, str]]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "jepsen-final", "enable.auto.commit": False, "log_level": 2}
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(KafkaTopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)
        }
        consumer.assign([KafkaTopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        final: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + FINAL_READ_S
        while any((final[p][-1][0] + 1 if final[p] else 0) < ends[p] for p in range(PARTITIONS)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the final read did not reach the log ends {ends} in {FINAL_READ_S} s")
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            final[message.partition() or 0].append((message.offset() or 0, (message.value() or b"").decode()))
        return final
    finally:
        consumer.close()
