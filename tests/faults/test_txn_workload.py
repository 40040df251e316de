"""The transactional workload's guard against librdkafka's send_offsets_to_transaction blocking for ever past its
timeout (librdkafka #5456, #5511: seen in fault runs as a processor stalled after the faults healed), with a
stand-in producer whose call blocks."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from tierlog.faults.txn_checker import UNKNOWN, Transaction
from tierlog.faults.txn_workload import ClientCallStuck, run_transaction, send_offsets_or_give_up


class StuckProducer:
    """send_offsets_to_transaction blocks until released, as librdkafka's does once its group coordinator was
    decommissioned; any other transactional call is recorded."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(self, offsets: object, group_metadata: object, timeout: float) -> None:
        self.calls.append("send_offsets")
        self.release.wait(30)

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


def test_a_send_offsets_call_blocked_past_its_timeout_is_given_up() -> None:
    producer = StuckProducer()
    started = time.monotonic()
    try:
        with pytest.raises(ClientCallStuck, match="still blocked"):
            send_offsets_or_give_up(producer, [], object(), timeout_s=0.1, give_up_s=0.5)  # type: ignore[arg-type]
    finally:
        producer.release.set()
    assert 0.5 <= time.monotonic() - started < 5


def test_a_send_offsets_call_that_returns_keeps_its_result() -> None:
    producer = StuckProducer()
    producer.release.set()
    send_offsets_or_give_up(producer, [], object(), timeout_s=0.1, give_up_s=5)  # type: ignore[arg-type]

    class Failing(StuckProducer):
        def send_offsets_to_transaction(self, offsets: object, group_metadata: object, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))

    with pytest.raises(KafkaException):
        send_offsets_or_give_up(Failing(), [], object(), timeout_s=0.1, give_up_s=5)  # type: ignore[arg-type]


def test_a_transaction_whose_send_offsets_is_stuck_is_unknown_and_neither_committed_nor_aborted() -> None:
    producer = StuckProducer()
    txn = Transaction("processor-1/0", "commit")
    try:
        outcome = run_transaction(
            producer,  # type: ignore[arg-type]
            txn,
            lambda: send_offsets_or_give_up(producer, [], object(), timeout_s=0.1, give_up_s=0.5),  # type: ignore[arg-type]
        )
    finally:
        producer.release.set()
    assert outcome == UNKNOWN
    assert producer.calls == ["begin", "send_offsets"]
