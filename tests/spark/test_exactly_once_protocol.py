"""The transactional sink's two-phase commit against a model of Kafka's transaction coordinator, crashed at every
request in turn: whatever the crash point, the restarted query leaves every input row exactly once among the
committed records (what a read_committed reader sees), and nothing open. No broker, no Spark: the driver's and
the tasks' code (tierlog.spark.exactly_once) runs as Spark runs it, micro-batch after micro-batch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tierlog.common import TopicPartition
from tierlog.records.codec import decode_raw_records
from tierlog.records.record_batch import CompressionType, complete_batches, read_header
from tierlog.spark.exactly_once import (
    SinkLog,
    SinkRow,
    TaskTransaction,
    TransactionWriter,
    commit_batch,
    complete_decisions,
    query_prefix,
    transactional_id,
)
from tierlog.spark.txn_client import ListedTransaction, ProducerIdAndEpoch, TransactionError

PREFIX, QUERY = "tierlog-spark", "q1"
TIMEOUT_MS = 900_000
OUTPUT_PARTITIONS = 3


class Crash(Exception):
    """The driver (and its executors) die here: every later step of this run is gone."""


@dataclass
class Txn:
    producer_id: int
    epoch: int
    state: str = "Empty"
    partitions: set[TopicPartition] = field(default_factory=set)
    records: list[bytes] = field(default_factory=list)


class KafkaModel:
    """Kafka's coordinator and logs for one sink, as far as the sink can tell: InitProducerId bumps the epoch
    and aborts an open transaction; requests of an older epoch are fenced; EndTxn of a completed transaction
    with the same decision and epoch is answered without error. `crash_at` makes the n-th request fail."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.txns: dict[str, Txn] = {}
        self.committed: list[bytes] = []
        self.aborted: list[bytes] = []
        self.requests = 0
        self.crash_at = crash_at
        self._next_producer_id = 1000

    def _request(self) -> None:
        self.requests += 1
        if self.crash_at is not None and self.requests == self.crash_at:
            raise Crash()

    def _current(self, tid: str, producer: ProducerIdAndEpoch) -> Txn:
        txn = self.txns.get(tid)
        if txn is None or txn.producer_id != producer.producer_id or txn.epoch != producer.producer_epoch:
            raise TransactionError(f"request of {tid}", "PRODUCER_FENCED")
        return txn

    def init_producer_id(self, transactional_id: str, transaction_timeout_ms: int) -> ProducerIdAndEpoch:
        self._request()
        txn = self.txns.get(transactional_id)
        if txn is None:
            txn = self.txns[transactional_id] = Txn(self._next_producer_id, -1)
            self._next_producer_id += 1
        if txn.state == "Ongoing":
            self.aborted.extend(txn.records)
        txn.epoch += 1
        txn.state, txn.partitions, txn.records = "Empty", set(), []
        return ProducerIdAndEpoch(txn.producer_id, txn.epoch)

    def end_txn(self, transactional_id: str, producer: ProducerIdAndEpoch, commit: bool) -> str | None:
        self._request()
        try:
            txn = self._current(transactional_id, producer)
        except TransactionError as e:
            return e.error
        done = "CompleteCommit" if commit else "CompleteAbort"
        if txn.state == done:
            return None
        if txn.state != "Ongoing":
            return "INVALID_TXN_STATE"
        (self.committed if commit else self.aborted).extend(txn.records)
        txn.state, txn.records = done, []
        return None

    def list_transactions(self, states: Iterable[str] = ()) -> list[ListedTransaction]:
        self._request()
        wanted = set(states)
        return [
            ListedTransaction(tid, t.producer_id, t.state)
            for tid, t in self.txns.items()
            if not wanted or t.state in wanted
        ]

    def partition_count(self, topic: str) -> int:
        return OUTPUT_PARTITIONS

    def add_partitions(
        self, transactional_id: str, producer: ProducerIdAndEpoch, partitions: Iterable[TopicPartition]
    ) -> None:
        self._request()
        txn = self._current(transactional_id, producer)
        txn.partitions.update(partitions)
        txn.state = "Ongoing"

    def produce(
        self, transactional_id: str, batches: Mapping[TopicPartition, bytes], acks: int, timeout_ms: int
    ) -> None:
        self._request()
        txn = self._current(transactional_id, producer=self._producer_of(batches))
        for tp, batch in batches.items():
            assert tp in txn.partitions, "a partition is added to the transaction before its first batch"
            for position, _ in complete_batches(batch):
                header = read_header(batch, position)
                assert header.is_transactional
                txn.records.extend(r.value for r in decode_raw_records(batch[position:], header))

    @staticmethod
    def _producer_of(batches: Mapping[TopicPartition, bytes]) -> ProducerIdAndEpoch:
        header = read_header(next(iter(batches.values())))
        return ProducerIdAndEpoch(header.producer_id, header.producer_epoch)

    def open_transactions(self) -> list[str]:
        return [tid for tid, t in self.txns.items() if t.state == "Ongoing"]


def run_task(kafka: KafkaModel, batch_id: int, partition: int, rows: list[bytes]) -> TaskTransaction:
    """What sink.write_in_transaction does on an executor, with the model for a client."""
    tid = transactional_id(PREFIX, QUERY, partition)
    producer = kafka.init_producer_id(tid, TIMEOUT_MS)
    writer = TransactionWriter(kafka, tid, producer, acks=-1, timeout_ms=30_000, compression=CompressionType.LZ4)
    for i, value in enumerate(rows):
        writer.add(SinkRow("out", f"k{i}".encode(), value, (), None), 0)
        if i % 2 == 1:
            writer.flush()  # several Produce requests per task, so a crash can fall between them
    writer.flush()
    partitions = writer.written_partitions()
    return TaskTransaction(tid, producer.producer_id, producer.producer_epoch, batch_id, partitions, writer.records)


def run_query(kafka: KafkaModel, log: SinkLog, spark_commits: set[int], inputs: list[list[str]], tasks: int) -> None:
    """Spark's micro-batch loop from the first batch its commit log lacks: plan (the driver completes decided
    batches), run the tasks (rows spread over `tasks` Spark partitions), commit, then write the commit log."""
    for batch_id, rows in enumerate(inputs):
        if batch_id in spark_commits:
            continue
        complete_decisions(kafka, log)
        messages = [run_task(kafka, batch_id, p, [row.encode() for row in rows[p::tasks]]) for p in range(tasks)]
        commit_batch(kafka, log, batch_id, messages, query_prefix(PREFIX, QUERY), TIMEOUT_MS)
        spark_commits.add(batch_id)


INPUTS = [[f"b{b}-r{r}" for r in range(5)] for b in range(3)]
EXPECTED = sorted(row.encode() for rows in INPUTS for row in rows)


def _requests_of_a_clean_run(tmp_path: Path) -> int:
    kafka = KafkaModel()
    run_query(kafka, SinkLog(str(tmp_path / "clean")), set(), INPUTS, tasks=2)
    assert sorted(kafka.committed) == EXPECTED
    return kafka.requests


def test_a_run_without_crashes_commits_every_row_once_and_leaves_nothing_open(tmp_path: Path) -> None:
    kafka = KafkaModel()
    log = SinkLog(str(tmp_path))
    run_query(kafka, log, set(), INPUTS, tasks=2)
    assert sorted(kafka.committed) == EXPECTED
    assert kafka.open_transactions() == []
    assert [d.batch_id for d in log.decisions()] == [0, 1, 2] and all(d.completed for d in log.decisions())


@pytest.mark.parametrize("rerun_tasks", [2, 1, 3])
def test_a_crash_at_any_request_then_a_restart_commits_every_row_exactly_once(tmp_path: Path, rerun_tasks: int) -> None:
    """Every crash point of a 3-batch query: before, between and after the tasks' requests, after the decision
    and between its EndTxns, after all of them (before Spark's commit log). The restarted run may cut the batch
    into a different number of Spark partitions."""
    for crash_at in range(1, _requests_of_a_clean_run(tmp_path) + 1):
        kafka = KafkaModel(crash_at)
        log = SinkLog(str(tmp_path / f"crash-{crash_at}-{rerun_tasks}"))
        spark_commits: set[int] = set()
        with pytest.raises(Crash):
            run_query(kafka, log, spark_commits, INPUTS, tasks=2)
        kafka.crash_at = None
        run_query(kafka, log, spark_commits, INPUTS, tasks=rerun_tasks)
        assert sorted(kafka.committed) == EXPECTED, f"crash at request {crash_at}"
        assert kafka.open_transactions() == [], f"crash at request {crash_at}"


def test_two_crashes_in_a_row_are_recovered_too(tmp_path: Path) -> None:
    total = _requests_of_a_clean_run(tmp_path)
    for first in range(1, total + 1, 3):
        kafka = KafkaModel(first)
        log = SinkLog(str(tmp_path / f"twice-{first}"))
        spark_commits: set[int] = set()
        with pytest.raises(Crash):
            run_query(kafka, log, spark_commits, INPUTS, tasks=2)
        kafka.crash_at = kafka.requests + 2  # two requests into the restarted run
        with contextlib.suppress(Crash):
            run_query(kafka, log, spark_commits, INPUTS, tasks=2)
        kafka.crash_at = None
        run_query(kafka, log, spark_commits, INPUTS, tasks=2)
        assert sorted(kafka.committed) == EXPECTED, f"first crash at request {first}"


def test_a_decided_batch_whose_transaction_the_coordinator_aborted_fails_loudly(tmp_path: Path) -> None:
    """The one way rows are lost: a decided transaction aborted before its commit (its timeout passed during a
    long outage). The commit then fails naming the transaction, rather than reporting the batch committed."""
    kafka = KafkaModel()
    log = SinkLog(str(tmp_path))
    messages = [run_task(kafka, 0, 0, [b"a", b"b"])]
    kafka.init_producer_id(messages[0].transactional_id, TIMEOUT_MS)  # what the coordinator's timeout abort does
    with pytest.raises(RuntimeError, match=r"micro-batch 0: the transaction of tierlog-spark-q1-0 .* PRODUCER_FENCED"):
        commit_batch(kafka, log, 0, messages, None, TIMEOUT_MS)
