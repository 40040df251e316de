"""aiokafka's transactional API against a real broker: a transaction context that commits, one that aborts on an
exception, send_offsets_to_transaction by group id, read back by aiokafka's own read_committed consumer, and zombie
fencing (docs/transactions.md#proof)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from asyncio_helpers import run_bounded
from txn_helpers import TIMEOUT_S, group_offsets, read_whole, unique, values

from tierlog.testing.local_cluster import BrokerProcess

DEADLINE_S = 60.0
QUIET_S = 1.0


class Deliberate(Exception):
    """Raised inside a transaction context to have it aborted."""


def transactional(bootstrap: str, transactional_id: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, request_timeout_ms=20_000)


async def read_committed(bootstrap: str, topic: str, partitions: range, expected: int) -> list[bytes]:
    """What aiokafka's read_committed consumer reads from the start: `expected` records, then QUIET_S more."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        seen: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until = None
        while quiet_until is None or time.monotonic() < quiet_until:
            assert time.monotonic() < deadline, f"read {len(seen)} of {expected} committed records"
            for records in (await consumer.getmany(timeout_ms=200)).values():
                seen.extend((r.partition, r.offset, r.value or b"") for r in records)
            if quiet_until is None and len(seen) >= expected:
                quiet_until = time.monotonic() + QUIET_S
        return [value for _, _, value in sorted(seen)]
    finally:
        await consumer.stop()


def test_aiokafka_commits_and_aborts_across_partitions(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 2)

    async def scenario() -> list[bytes]:
        producer = transactional(bootstrap, unique("aiokafka"))
        await producer.start()
        try:
            for label, commit in ((b"kept-1", True), (b"aborted", False), (b"kept-2", True)):
                try:
                    async with producer.transaction():
                        for partition in (0, 1):
                            await producer.send_and_wait(topic, label + b"-p%d" % partition, partition=partition)
                        if not commit:
                            raise Deliberate
                except Deliberate:
                    pass
        finally:
            await producer.stop()
        return await read_committed(bootstrap, topic, range(2), 4)

    assert run_bounded(scenario, DEADLINE_S) == [b"kept-1-p0", b"kept-2-p0", b"kept-1-p1", b"kept-2-p1"]
    assert b"aborted-p0" in values(read_whole(bootstrap, topic, range(2), "read_uncommitted"))


def test_aiokafka_sends_the_group_offsets_with_the_transaction(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    source, sink = kafka.new_topic(bootstrap, 1, hint="-in"), kafka.new_topic(bootstrap, 1, hint="-out")
    kafka.produce(bootstrap, source, [{"value": b"in-%d" % i} for i in range(6)])
    group = unique("aiokafka-ctp")

    async def scenario() -> None:
        consumer = AIOKafkaConsumer(
            source,
            bootstrap_servers=bootstrap,
            group_id=group,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        producer = transactional(bootstrap, unique("aiokafka-ctp"))
        await consumer.start()
        await producer.start()
        try:
            for commit in (True, False):
                inputs: list[Any] = []
                while len(inputs) < 3:
                    for records in (await consumer.getmany(timeout_ms=500, max_records=3 - len(inputs))).values():
                        inputs.extend(records)
                try:
                    async with producer.transaction():
                        for record in inputs:
                            await producer.send(sink, b"out-" + record.value)
                        await producer.send_offsets_to_transaction(
                            {TopicPartition(source, 0): inputs[-1].offset + 1}, group
                        )
                        if not commit:
                            raise Deliberate
                except Deliberate:
                    pass
                assert await asyncio.to_thread(group_offsets, bootstrap, group, source, [0]) == {0: 3}
        finally:
            await producer.stop()
            await consumer.stop()

    run_bounded(scenario, DEADLINE_S)
    assert values(read_whole(bootstrap, sink, [0], "read_committed")) == [b"out-in-0", b"out-in-1", b"out-in-2"]


def test_aiokafka_producer_is_fenced_by_its_successor(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 1)
    transactional_id = unique("aiokafka-zombie")

    async def scenario() -> list[bytes]:
        zombie = transactional(bootstrap, transactional_id)
        await zombie.start()
        try:
            await zombie.begin_transaction()
            await zombie.send_and_wait(topic, b"zombie")
            successor = transactional(bootstrap, transactional_id)
            await successor.start()
            try:
                async with successor.transaction():
                    await successor.send(topic, b"successor")
            finally:
                await successor.stop()
            with pytest.raises(KafkaError) as fenced:
                await zombie.send_and_wait(topic, b"zombie-2")
                await zombie.commit_transaction()
            assert "fenced" in repr(fenced.value).lower() or "epoch" in repr(fenced.value).lower(), fenced.value
        finally:
            await zombie.stop()
        return await read_committed(bootstrap, topic, range(1), 1)

    assert run_bounded(scenario, DEADLINE_S) == [b"successor"]
