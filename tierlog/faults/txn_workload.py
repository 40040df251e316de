"""A transactional fault run: the ProxiedCluster and nemesis of workload.py, with transactions instead of plain
writes (docs/transactions.md#proof).

    history, verdict = transactional_fault_run(Path("/tmp/run"), seconds=45, seed=7, say=print)

- Transactional producers (confluent-kafka): each transaction writes 2-6 records spread over the partitions of
  `txn`, and a seeded quarter of them is aborted on purpose; a producer that is fenced or loses its transaction
  mid-commit starts again under the same transactional.id (fencing its former self, whose last transaction the
  coordinator then completes or aborts: its outcome is unknown to the client).
- Consume-transform-produce: an idempotent producer writes inputs to `txn-in`; two processors in one consumer
  group (read_committed) each turn a batch of inputs into outputs on `txn-out` (spread over its partitions) and
  send the batch's offsets with the transaction (send_offsets_to_transaction, KIP-447's group metadata); a
  quarter of them are aborted on purpose, after which the processor goes back to the group's committed offsets;
  a send_offsets_to_transaction that librdkafka leaves blocked past its timeout is given up (SEND_OFFSETS_GIVE_UP_S).
- Two read_committed consumers assigned every partition of `txn` and `txn-out` from offset 0 record what they
  poll, in order.

After the faults heal: the producers end their transactions, the processors catch up with the inputs, the cluster
converges, every partition's last stable offset reaches its high watermark, and `txn` and `txn-out` are read
whole with read_committed and with read_uncommitted, the inputs once, and the group's committed offsets fetched;
txn_checker judges the history.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from tierlog.faults.checker import Verdict
from tierlog.faults.cluster import ProxiedCluster
from tierlog.faults.txn_checker import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    OffsetFetch,
    Partition,
    Transaction,
    TxnHistory,
    check_transactions,
)
from tierlog.faults.workload import CONVERGE_S, OVERRIDES, Nemesis, controller_failovers, converged, stop_and_heal
from tierlog.testing.local_cluster import wait_until

TXN_TOPIC = "txn"
INPUT_TOPIC = "txn-in"
OUTPUT_TOPIC = "txn-out"
PARTITIONS = 3
GROUP = "txn-processors"
TOPICS = {TXN_TOPIC: PARTITIONS, INPUT_TOPIC: PARTITIONS, OUTPUT_TOPIC: PARTITIONS}
TXN_OVERRIDES = {
    **OVERRIDES,
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    # Kafka's 50 partitions are more coordinator loading than a 2-core run needs to exercise failover.
    "transaction.state.log.num.partitions": "5",
    "offsets.topic.num.partitions": "5",
}
# On purpose: this share of the transactions is aborted by its producer.
ABORT_SHARE = 0.25
TXN_RECORDS = (2, 6)
BATCH = 10
TRANSACTION_TIMEOUT_MS = 10_000
# One init/commit/abort/send_offsets call; a retriable failure is retried until END_S has passed.
CALL_S = 10.0
END_S = 60.0
PAUSE_S = 0.02
INPUT_INTERVAL_S = 0.02
# After healing, a processor's transaction can take seconds (up to 10 s seen) while the coordinators settle.
CATCH_UP_S = 240.0
RESEEK_IDLE_S = 5.0
# librdkafka's send_offsets_to_transaction can block for ever past its timeout: its TxnOffsetCommit waits for a
# group coordinator that left the metadata (a killed broker is fenced, and librdkafka decommissions it), and once
# the faults are healed no broker state change wakes it (librdkafka #5456, #5511). A call still blocked this long
# after it was made is given up: its transaction's outcome is unknown and a new producer fences the stuck one.
SEND_OFFSETS_GIVE_UP_S = 3 * CALL_S
# A transaction left open by a producer that is gone is aborted by the coordinator after its timeout.
STABLE_S = 3 * TRANSACTION_TIMEOUT_MS / 1000 + 30
FINAL_READ_S = 60.0
QUIET = {"log_level": 2}  # connection errors are the point of the run: keep them off stderr


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    """A transactional producer whose init_transactions has succeeded (retried while retriable)."""
    producer = Producer(
        {
            **QUIET,
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            # librdkafka #4953, as workload.ProducerThread: one request at a time keeps the history about the broker
            "max.in.flight.requests.per.connection": 1,
            "linger.ms": 5,
            "request.timeout.ms": 5000,
            "retry.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    deadline = time.monotonic() + END_S
    while True:
        try:
            producer.init_transactions(CALL_S)
            return producer
        except KafkaException as error:
            if not error.args[0].retriable() or time.monotonic() > deadline:
                raise


def end_transaction(producer: Producer, commit: bool) -> str:
    """Commit or abort the producer's transaction as the client tells: COMMITTED or ABORTED once
    commit_transaction or abort_transaction returned, UNKNOWN if it cannot say (a fatal error, or still failing
    after END_S). A commit refused as abortable is aborted."""
    deadline = time.monotonic() + END_S
    while True:
        try:
            if commit:
                producer.commit_transaction(CALL_S)
                return COMMITTED
            producer.abort_transaction(CALL_S)
            return ABORTED
        except KafkaException as exception:
            error: KafkaError = exception.args[0]
            if error.fatal() or time.monotonic() > deadline:
                return UNKNOWN
            if error.txn_requires_abort():
                commit = False
            elif not error.retriable():
                return UNKNOWN


class TxnProducerThread(threading.Thread):
    def __init__(self, name: str, bootstrap: str, seed: int, history: TxnHistory, lock: threading.Lock) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._servers = bootstrap
        self._rng = random.Random(f"{seed}-{name}")
        self._history = history
        self._lock = lock

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported by the caller
            self.error = error

    def _run(self) -> None:
        producer: Producer | None = None
        count = 0
        while not self.stopping.is_set():
            if producer is None:
                producer = transactional_producer(self._servers, self.name)
            txn = Transaction(f"{self.name}/{count}", "abort" if self._rng.random() < ABORT_SHARE else "commit")
            count += 1
            first = self._rng.randrange(PARTITIONS)
            records = [((first + i) % PARTITIONS, f"{txn.txn_id}/{i}") for i in range(self._rng.randint(*TXN_RECORDS))]
            txn.outcome = run_transaction(producer, txn, partial(_write, producer, txn, records))
            with self._lock:
                self._history.transactions.append(txn)
            if txn.outcome == UNKNOWN:
                producer = None  # its successor's init_transactions fences it and ends what it left
            self.stopping.wait(PAUSE_S)


def _write(producer: Producer, txn: Transaction, records: list[tuple[int, str]]) -> None:
    for partition, value in records:
        txn.records.append((TXN_TOPIC, partition, value))
        producer.produce(TXN_TOPIC, value.encode(), partition=partition)
    producer.poll(0)


class ClientCallStuck(Exception):
    """A librdkafka call is still blocked long after its timeout: the producer can make no other transactional
    call, and is given up."""


def send_offsets_or_give_up(
    producer: Producer,
    offsets: list[KafkaTopicPartition],
    group_metadata: object,
    timeout_s: float = CALL_S,
    give_up_s: float = SEND_OFFSETS_GIVE_UP_S,
) -> None:
    """producer.send_offsets_to_transaction(offsets, group_metadata, timeout_s), raising ClientCallStuck if it has
    not returned after `give_up_s` (librdkafka #5456, #5511); the call is left blocked on a daemon thread, which
    holds the producer so that it is never destroyed under it."""
    outcome: list[BaseException | None] = []
    returned = threading.Event()

    def call() -> None:
        try:
            producer.send_offsets_to_transaction(offsets, group_metadata, timeout_s)
            outcome.append(None)
        except BaseException as error:  # handed to the caller
            outcome.append(error)
        finally:
            returned.set()

    threading.Thread(target=call, name="send-offsets", daemon=True).start()
    if not returned.wait(give_up_s):
        raise ClientCallStuck(f"send_offsets_to_transaction({timeout_s:.0f} s) still blocked after {give_up_s:.0f} s")
    if outcome[0] is not None:
        raise outcome[0]


def run_transaction(producer: Producer, txn: Transaction, write: Callable[[], None]) -> str:
    """Begin a transaction, `write` into it, and end it as `txn.intent` says; its outcome as the client saw it
    (UNKNOWN when a call of `write` is stuck: the producer can neither commit nor abort)."""
    try:
        producer.begin_transaction()
        write()
    except ClientCallStuck:
        return UNKNOWN
    except KafkaException as exception:
        error: KafkaError = exception.args[0]
        if error.fatal() or not error.txn_requires_abort():
            return UNKNOWN
        return end_transaction(producer, commit=False)
    except BufferError:
        return end_transaction(producer, commit=False)
    return end_transaction(producer, commit=txn.intent == "commit")


class InputThread(threading.Thread):
    """Writes `in-<n>` to the input topic's partitions in turn (idempotent, acks=all)."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="inputs", daemon=True)
        self.stopping = threading.Event()
        self.producer = Producer(
            {
                **QUIET,
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "max.in.flight.requests.per.connection": 1,
                "linger.ms": 5,
                "request.timeout.ms": 5000,
                "message.timeout.ms": 60_000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )

    def run(self) -> None:
        count = 0
        while not self.stopping.is_set():
            try:
                self.producer.produce(INPUT_TOPIC, f"in-{count}".encode(), partition=count % PARTITIONS)
                count += 1
            except BufferError:
                pass
            self.producer.poll(INPUT_INTERVAL_S)
        self.producer.flush(60)


class ProcessorThread(threading.Thread):
    """Consume-transform-produce: every batch of inputs becomes one transaction of outputs and their offsets."""

    def __init__(self, name: str, bootstrap: str, seed: int, history: TxnHistory, lock: threading.Lock) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._servers = bootstrap
        self._rng = random.Random(f"{seed}-{name}")
        self._history = history
        self._lock = lock
        self.progress: dict[str, int] = dict.fromkeys(
            (
                COMMITTED,
                ABORTED,
                UNKNOWN,
                "rewinds",
                "rejoins",
                "re-seeks when idle",
                "stuck send_offsets given up",
                "slowest transaction ms",
                "transactions over 2 s",
            ),
            0,
        )
        # what it was doing last, for a report of a stall
        self.where = "starting"
        # the last transaction's time in its writes with send_offsets_to_transaction, and in the latter alone
        self._transform_s = self._offsets_s = 0.0

    def _consumer(self) -> Consumer:
        consumer = Consumer(
            {
                **QUIET,
                "bootstrap.servers": self._servers,
                "group.id": GROUP,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        consumer.subscribe([INPUT_TOPIC])
        return consumer

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported by the caller
            self.error = error

    def _run(self) -> None:
        consumer = self._consumer()
        producer: Producer | None = None
        count = 0
        idle_since: float | None = None
        while not self.stopping.is_set():
            if producer is None:
                producer = transactional_producer(self._servers, self.name)
            polled = consumer.consume(BATCH, 0.2)
            inputs = [m for m in polled if m.error() is None]
            if not inputs:
                errors = [str(m.error()) for m in polled if m.error() is not None]
                self.where = f"idle, assigned {_positions(consumer)}, errors {errors[:3]}"
                idle_since = idle_since or time.monotonic()
                # A consumer seeked back after an abort was seen to fetch nothing more, while a new one read the
                # same offsets (docs/transactions.md#proof-faults): seeking again to the committed offsets is
                # always right between transactions, and counted.
                if time.monotonic() - idle_since > RESEEK_IDLE_S and _any_position_unknown(consumer):
                    self.progress["re-seeks when idle"] += 1
                    self._rewind(consumer)
                    idle_since = None
                continue
            idle_since = None
            txn = Transaction(f"{self.name}/{count}", "abort" if self._rng.random() < ABORT_SHARE else "commit")
            count += 1
            started = time.monotonic()
            txn.outcome = run_transaction(producer, txn, partial(self._transform, producer, consumer, txn, inputs))
            took = time.monotonic() - started
            if took * 1000 > self.progress["slowest transaction ms"]:
                self.progress["slowest transaction ms"] = int(took * 1000)
                # where its time went: the writes and send_offsets_to_transaction, then ending it
                self.progress["its send_offsets ms"] = int(self._offsets_s * 1000)
                self.progress["its end ms"] = int((took - self._transform_s) * 1000)
            self.progress["transactions over 2 s"] += took > 2.0
            with self._lock:
                self._history.transactions.append(txn)
            if txn.outcome == UNKNOWN:
                # The successor's init_transactions ends what this transaction left before the rewind reads the
                # group's offsets (require_stable waits for that too).
                producer = transactional_producer(self._servers, self.name)
            self.progress[txn.outcome] += 1
            self.progress["rewinds"] += txn.outcome != COMMITTED
            if txn.outcome != COMMITTED and not self._rewind(consumer):
                self.progress["rejoins"] += 1
                consumer.close()
                consumer = self._consumer()  # joins again: it starts from the group's committed offsets
            self.stopping.wait(PAUSE_S)
        consumer.close()

    def _rewind(self, consumer: Consumer) -> bool:
        """Seek every assigned partition back to the group's committed offset (noted in the history); False if
        that failed."""
        with self._lock:
            ended = len(self._history.transactions)
        try:
            deadline = time.monotonic() + CALL_S
            # UNSTABLE_OFFSET_COMMIT while the last transaction's markers are on their way: ask again.
            committed = consumer.committed(consumer.assignment(), CALL_S)
            while any(tp.error is not None for tp in committed):
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)
                committed = consumer.committed(consumer.assignment(), CALL_S)
            with self._lock:
                told = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
                self._history.offset_fetches.append(OffsetFetch(self.name, ended, told))
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                consumer.seek(KafkaTopicPartition(tp.topic, tp.partition, offset))
            return True
        except KafkaException:
            return False

    def _transform(self, producer: Producer, consumer: Consumer, txn: Transaction, inputs: Iterable[Message]) -> None:
        started = time.monotonic()
        self._offsets_s = self._transform_s = 0.0
        for message in inputs:
            partition, offset = message.partition() or 0, message.offset() or 0
            value = f"{txn.txn_id}/{partition}:{offset}"
            output_partition = offset % PARTITIONS
            txn.records.append((OUTPUT_TOPIC, output_partition, value))
            txn.sources[value] = (partition, offset)
            producer.produce(OUTPUT_TOPIC, value.encode(), partition=output_partition)
            txn.offsets[partition] = max(txn.offsets.get(partition, 0), offset + 1)
        sending = time.monotonic()
        try:
            send_offsets_or_give_up(
                producer,
                [KafkaTopicPartition(INPUT_TOPIC, p, o) for p, o in sorted(txn.offsets.items())],
                consumer.consumer_group_metadata(),
            )
        except ClientCallStuck:
            self.progress["stuck send_offsets given up"] += 1
            raise
        self._offsets_s = time.monotonic() - sending
        self._transform_s = time.monotonic() - started


class ReadCommittedThread(threading.Thread):
    """Assigned every partition of `txn` and `txn-out` from offset 0, read_committed, no group."""

    def __init__(self, name: str, bootstrap: str, records: list[tuple[str, int, int, str]]) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.records = records
        self.consumer = Consumer(
            {
                **QUIET,
                "bootstrap.servers": bootstrap,
                "group.id": f"txn-{name}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.consumer.assign(
            [KafkaTopicPartition(t, p, 0) for t in (TXN_TOPIC, OUTPUT_TOPIC) for p in range(PARTITIONS)]
        )

    def run(self) -> None:
        while not self.stopping.is_set():
            message = self.consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            value = (message.value() or b"").decode()
            self.records.append((message.topic() or "", message.partition() or 0, message.offset() or 0, value))
        self.consumer.close()


def transactional_fault_run(
    base_dir: Path, seconds: float, seed: int, say: Callable[[str], None] = lambda _: None
) -> tuple[TxnHistory, Verdict]:
    history = TxnHistory()
    lock = threading.Lock()
    with ProxiedCluster(base_dir, 3, TXN_OVERRIDES) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        for future in admin.create_topics([NewTopic(t, n, 3) for t, n in TOPICS.items()]).values():
            future.result(30)
        wait_until(lambda: converged(cluster, TOPICS), 30, "topic replicas to start", interval_s=0.5)
        writers = [TxnProducerThread(f"txn-producer-{i}", cluster.bootstrap, seed, history, lock) for i in (1, 2)]
        processors = [ProcessorThread(f"processor-{i}", cluster.bootstrap, seed, history, lock) for i in (1, 2)]
        inputs = InputThread(cluster.bootstrap)
        readers = []
        for i in (1, 2):
            history.polls[f"reader-{i}"] = []
            readers.append(ReadCommittedThread(f"reader-{i}", cluster.bootstrap, history.polls[f"reader-{i}"]))
        nemesis = Nemesis(cluster, seed, history, time.monotonic(), say)
        for thread in [*writers, inputs, *processors, *readers, nemesis]:
            thread.start()
        time.sleep(seconds)
        stop_and_heal(cluster, nemesis, say)
        for thread in [*writers, inputs]:
            thread.stopping.set()
        for thread in [*writers, inputs]:
            thread.join(END_S + 30)
        say("  the processors catch up with the inputs")
        catch_up_started = time.monotonic()
        if _wait_or_note(history, say, lambda: _caught_up(admin), CATCH_UP_S, "the processors to commit every input"):
            say(f"  caught up in {time.monotonic() - catch_up_started:.1f} s")
        else:
            say(
                f"  input ends: {_latest(admin, INPUT_TOPIC, IsolationLevel.READ_UNCOMMITTED)}, last stable offsets: "
                f"{_latest(admin, INPUT_TOPIC, IsolationLevel.READ_COMMITTED)}"
            )
            for stable in (False, True):
                say(f"  the group's offsets (require_stable={stable}): {_group_answer(admin, stable)}")
            frames = sys._current_frames()
            for processor in processors:
                say(f"  {processor.name}: {processor.where}")
                frame = frames.get(processor.ident or -1)
                if frame is not None:
                    stack = traceback.format_stack(frame)[-3:]
                    say(
                        f"  {processor.name} is at: {' <- '.join(line.strip().replace(chr(10), ' ') for line in stack)}"
                    )
            say(f"  a new read_committed consumer from the group's offsets reads: {_probe(cluster.bootstrap, admin)}")
            for command in (["list"], *(["describe", "--transactional-id", p.name] for p in processors)):
                say(f"  tierlog transactions {' '.join(command)}: {_transactions_cli(cluster.bootstrap, command)}")
        for processor in processors:
            processor.stopping.set()
        for processor in processors:
            processor.join(END_S + 30)
            say(f"  {processor.name}: {processor.progress}")
        for thread in [*writers, *processors]:
            if thread.error is not None:
                raise RuntimeError(f"{thread.name} failed: {thread.error!r}") from thread.error
        wait_until(lambda: converged(cluster, TOPICS), CONVERGE_S, "every replica to catch up", interval_s=0.5)
        _wait_or_note(
            history, say, lambda: _stable(admin), STABLE_S, "every last stable offset to reach its high watermark"
        )
        nemesis.watch_quorum()
        written = [(t, p) for t in (TXN_TOPIC, OUTPUT_TOPIC) for p in range(PARTITIONS)]
        history.committed_final = _read_whole(cluster.bootstrap, written, "read_committed")
        history.uncommitted_final = _read_whole(cluster.bootstrap, written, "read_uncommitted")
        read = _read_whole(cluster.bootstrap, [(INPUT_TOPIC, p) for p in range(PARTITIONS)], "read_uncommitted")
        history.inputs_final = {p: records for (_, p), records in read.items()}
        history.group_offsets = _group_offsets(cluster.bootstrap)
        ends = {tp: records[-1][0] for tp, records in history.committed_final.items() if records}
        wait_until(lambda: all(_reached(r.records, ends) for r in readers), 30, "readers to reach the log end", 0.5)
        for reader in readers:
            reader.stopping.set()
            reader.join(30)
    for line in controller_failovers(history):
        say(f"  failover: {line}")
    return history, check_transactions(history)


def _group_answer(admin: AdminClient, require_stable: bool) -> dict[int, object]:
    """partition -> the group's committed offset, or the error OffsetFetch answered for it."""
    request = ConsumerGroupTopicPartitions(GROUP, [KafkaTopicPartition(INPUT_TOPIC, p) for p in range(PARTITIONS)])
    try:
        result = admin.list_consumer_group_offsets([request], require_stable=require_stable)[GROUP].result(10)
    except KafkaException as error:
        return {-1: str(error)}
    return {tp.partition: tp.offset if tp.error is None else tp.error.name() for tp in result.topic_partitions}


def _probe(bootstrap: str, admin: AdminClient) -> dict[int, list[int]]:
    """partition -> the first offsets a new read_committed consumer assigned at the group's offsets gets in 5 s."""
    starts = {p: o for p, o in _group_answer(admin, True).items() if isinstance(o, int) and p >= 0}
    consumer = Consumer(
        {**QUIET, "bootstrap.servers": bootstrap, "group.id": "txn-probe", "isolation.level": "read_committed"}
    )
    try:
        consumer.assign([KafkaTopicPartition(INPUT_TOPIC, p, o) for p, o in starts.items()])
        got: dict[int, list[int]] = {p: [] for p in starts}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for message in consumer.consume(100, 0.2):
                if message.error() is None and len(got[message.partition() or 0]) < 3:
                    got[message.partition() or 0].append(message.offset() or 0)
        return got
    finally:
        consumer.close()


def _transactions_cli(bootstrap: str, command: list[str]) -> str:
    """What `tierlog transactions ...` prints (kafka-transactions.sh's view of the coordinators)."""
    args = [sys.executable, "-m", "tierlog", "transactions", *command, "--bootstrap-server", bootstrap]
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    return (done.stdout + done.stderr).strip().replace("\n", " | ")


def _any_position_unknown(consumer: Consumer) -> bool:
    try:
        return any(tp.offset < 0 for tp in consumer.position(consumer.assignment()))
    except KafkaException:
        return False


def _positions(consumer: Consumer) -> dict[int, int]:
    try:
        return {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
    except KafkaException as error:
        return {-1: error.args[0].code()}


def _wait_or_note(
    history: TxnHistory, say: Callable[[str], None], condition: Callable[[], bool], timeout_s: float, what: str
) -> bool:
    """Wait for `condition`; if it does not come (False), the history notes a stall and the run goes on to be
    checked."""
    try:
        wait_until(condition, timeout_s, what, interval_s=1.0)
        return True
    except TimeoutError as error:
        history.stalls.append(str(error))
        say(f"  STALL: {error}")
        return False


def _latest(admin: AdminClient, topic: str, isolation: IsolationLevel) -> dict[int, int]:
    futures = admin.list_offsets(
        {KafkaTopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)},
        isolation_level=isolation,
        request_timeout=10,
    )
    return {tp.partition: future.result().offset for tp, future in futures.items()}


def _caught_up(admin: AdminClient) -> bool:
    """The group's committed offsets are at the input topic's end."""
    try:
        ends = _latest(admin, INPUT_TOPIC, IsolationLevel.READ_UNCOMMITTED)
        request = ConsumerGroupTopicPartitions(GROUP, [KafkaTopicPartition(INPUT_TOPIC, p) for p in range(PARTITIONS)])
        group = admin.list_consumer_group_offsets([request])[GROUP].result(10)
    except KafkaException:
        return False
    committed = {tp.partition: tp.offset for tp in group.topic_partitions}
    return all(committed.get(p, -1) >= end for p, end in ends.items() if end > 0)


def _stable(admin: AdminClient) -> bool:
    """No open transaction: every partition's last stable offset is its high watermark."""
    try:
        for topic in TOPICS:
            if _latest(admin, topic, IsolationLevel.READ_COMMITTED) != _latest(
                admin, topic, IsolationLevel.READ_UNCOMMITTED
            ):
                return False
    except KafkaException:
        return False
    return True


def _read_whole(bootstrap: str, partitions: list[Partition], isolation: str) -> dict[Partition, list[tuple[int, str]]]:
    """Every record of `partitions` from offset 0 to the end (each partition read until its end-of-partition)."""
    consumer = Consumer(
        {
            **QUIET,
            "bootstrap.servers": bootstrap,
            "group.id": "txn-final",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([KafkaTopicPartition(t, p, 0) for t, p in partitions])
        final: dict[Partition, list[tuple[int, str]]] = {tp: [] for tp in partitions}
        at_end: set[Partition] = set()
        deadline = time.monotonic() + FINAL_READ_S
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - at_end)
                raise TimeoutError(f"the {isolation} read did not reach the end of {missing} in {FINAL_READ_S} s")
            message = consumer.poll(0.5)
            if message is None:
                continue
            where = (message.topic() or "", message.partition() or 0)
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(where)
                continue
            final[where].append((message.offset() or 0, (message.value() or b"").decode()))
        return final
    finally:
        consumer.close()


def _group_offsets(bootstrap: str) -> dict[int, int]:
    consumer = Consumer(
        {**QUIET, "bootstrap.servers": bootstrap, "group.id": GROUP, "isolation.level": "read_committed"}
    )
    try:
        committed = consumer.committed([KafkaTopicPartition(INPUT_TOPIC, p) for p in range(PARTITIONS)], CALL_S)
        return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
    finally:
        consumer.close()


def _reached(records: list[tuple[str, int, int, str]], ends: dict[Partition, int]) -> bool:
    last: dict[Partition, int] = {}
    for topic, partition, offset, _ in list(records):
        last[(topic, partition)] = offset
    return all(last.get(tp, -1) >= end for tp, end in ends.items())
