"""Transactional produce throughput against idempotent produce, on one local tierlog broker, measured with
confluent-kafka (librdkafka); the transaction size (messages per transaction) is the parameter.

For every transaction size it produces for about `--seconds` to a topic of `--partitions` partitions, in
transactions of that many messages spread over the partitions (begin, produce, commit_transaction: each commit is
an EndTxn and a marker written to every partition the transaction touched), and the same with an idempotent
producer (acks=all, no transactions) as the baseline. Both use linger.ms=5 and batch.size=1 MB. Then a
read_committed consumer reads the transactional topic back and must find every committed message.

    python bench/transactions.py                         # sizes 1, 10, 100, 1000; 6 s each
    python bench/transactions.py --sizes 1,50 --quick    # ~1.5 s each, for a smoke run

Writes bench/results/transactions.json (machine, parameters, results) and bench/results/transactions.png
(messages/s per transaction size, transactional against idempotent, and transactions/s with the mean commit time).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from common import TIMEOUT_S, argument_parser, machine_info, paired_bars, write_report
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import BrokerProcess

OVERRIDES = {
    "log.retention.check.interval.ms": "300000",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "offsets.topic.replication.factor": "1",
}
LINGER_MS = 5


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while (meta := admin.list_topics(topic=name, timeout=TIMEOUT_S).topics.get(name)) is None or meta.error:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {name} has no metadata after {TIMEOUT_S}s")
        time.sleep(0.05)


def client_config(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "linger.ms": LINGER_MS,
        "batch.size": 1_000_000,
        "compression.type": "none",
        "queue.buffering.max.messages": 1_000_000,
        "message.timeout.ms": int(TIMEOUT_S * 1000),
    }


def transactional(bootstrap: str, topic: str, partitions: int, size: int, payload: bytes, seconds: float) -> dict:
    """Transactions of `size` messages, message i to partition i % partitions, committed one after another."""
    config = {**client_config(bootstrap), "transactional.id": f"bench-{topic}"}
    config["transaction.timeout.ms"] = config["message.timeout.ms"]  # librdkafka: message <= transaction timeout
    producer = Producer(config)
    producer.init_transactions(TIMEOUT_S)
    messages = transactions = 0
    commit_s = 0.0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        producer.begin_transaction()
        for i in range(size):
            while True:
                try:
                    producer.produce(topic, payload, partition=i % partitions)
                    break
                except BufferError:
                    producer.poll(0.005)
        before = time.perf_counter()
        producer.commit_transaction(TIMEOUT_S)
        commit_s += time.perf_counter() - before
        messages += size
        transactions += 1
    elapsed = time.perf_counter() - started
    return {
        "messages": messages,
        "transactions": transactions,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(messages / elapsed),
        "mb_per_s": round(messages * len(payload) / elapsed / 1e6, 2),
        "txns_per_s": round(transactions / elapsed, 1),
        "mean_commit_ms": round(1000 * commit_s / transactions, 2),
    }


def idempotent(bootstrap: str, topic: str, partitions: int, payload: bytes, seconds: float) -> dict:
    """Messages round-robin over the partitions, acks=all with idempotence, as fast as the client takes them."""
    producer = Producer({**client_config(bootstrap), "enable.idempotence": True, "acks": "all"})
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    sent = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        try:
            producer.produce(topic, payload, partition=sent % partitions, on_delivery=on_delivery)
            sent += 1
        except BufferError:
            producer.poll(0.005)
        if sent % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if remaining or failures:
        raise RuntimeError(f"{remaining} undelivered, {len(failures)} failed, first: {failures[:1]}")
    return {
        "messages": sent,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(sent / elapsed),
        "mb_per_s": round(sent * len(payload) / elapsed / 1e6, 2),
    }


def read_committed_count(bootstrap: str, topic: str, partitions: int) -> int:
    """How many messages a read_committed consumer finds in `topic`, read to every partition's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-unused",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        count, at_end = 0, set()
        deadline = time.monotonic() + TIMEOUT_S
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read_committed reached the end of {sorted(at_end)} only, in {TIMEOUT_S}s")
            for message in consumer.consume(100_000, 0.5):
                error = message.error()
                if error is None:
                    count += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                else:
                    raise KafkaException(error)
        return count
    finally:
        consumer.close()


def draw(axes: Any, results: list[dict[str, Any]]) -> None:
    series = [
        ("transactional", [r["transactional"]["msgs_per_s"] for r in results], "#3b7dd8"),
        ("idempotent", [r["idempotent"]["msgs_per_s"] for r in results], "#e07b39"),
    ]
    paired_bars(axes[0], series, "{:,.0f}")
    axes[0].set_ylabel("messages/s")
    axes[0].set_title("produce throughput")
    bars = axes[1].bar(range(len(results)), [r["transactional"]["txns_per_s"] for r in results], color="#3b7dd8")
    labels = [f"{r['transactional']['txns_per_s']:,.0f}/s\n{r['transactional']['mean_commit_ms']} ms" for r in results]
    axes[1].bar_label(bars, labels=labels, fontsize=8, padding=2)
    axes[1].set_ylabel("transactions/s")
    axes[1].set_title("committed transactions/s (label: mean commit time)")


def main() -> None:
    parser = argument_parser(__doc__, "transactions", "about 1.5 s of producing per configuration")
    parser.add_argument("--seconds", type=float, default=6.0, help="produce for this long per configuration")
    parser.add_argument("--sizes", default="1,10,100,1000", help="messages per transaction, comma-separated")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topics")
    parser.add_argument("--message-bytes", type=int, default=1024)
    args = parser.parse_args()
    seconds = 1.5 if args.quick else args.seconds
    sizes = [int(s) for s in args.sizes.split(",")]
    payload = os.urandom(args.message_bytes)
    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-"))
    broker = BrokerProcess(work_dir / "data", overrides=OVERRIDES)
    results: list[dict[str, Any]] = []
    try:
        broker.start()
        broker.wait_ready(60)
        for size in sizes:
            txn_topic, idempotent_topic = f"bench-txn-{size}", f"bench-idempotent-{size}"
            create_topic(broker.bootstrap, txn_topic, args.partitions)
            create_topic(broker.bootstrap, idempotent_topic, args.partitions)
            txn = transactional(broker.bootstrap, txn_topic, args.partitions, size, payload, seconds)
            found = read_committed_count(broker.bootstrap, txn_topic, args.partitions)
            if found != txn["messages"]:
                raise RuntimeError(f"read_committed found {found} of {txn['messages']} committed messages")
            base = idempotent(broker.bootstrap, idempotent_topic, args.partitions, payload, seconds)
            results.append({"transaction_size": size, "transactional": txn, "idempotent": base})
            print(
                f"{size:>5} messages/transaction: transactional {txn['msgs_per_s']:>9,} msg/s "
                f"({txn['txns_per_s']:,} txn/s, commit {txn['mean_commit_ms']} ms), "
                f"idempotent {base['msgs_per_s']:>9,} msg/s",
                flush=True,
            )
    finally:
        broker.stop(60)
        shutil.rmtree(work_dir, ignore_errors=True)
    report = {
        "benchmark": "tierlog transactional vs idempotent produce throughput, confluent-kafka, one local broker",
        "machine": machine_info(),
        "parameters": {
            "produce_seconds": seconds,
            "transaction_sizes": sizes,
            "partitions": args.partitions,
            "message_bytes": args.message_bytes,
            "producer": {"linger.ms": LINGER_MS, "batch.size": 1_000_000, "compression.type": "none", "acks": "all"},
            "transactions": "one after another, each spread over every partition (message i to i % partitions)",
        },
        "results": results,
    }
    write_report(
        args.out,
        "transactions",
        report,
        title=f"tierlog transactions ({report['machine']['cpu']}, {report['machine']['cpu_count']} CPUs)",
        labels=[f"{r['transaction_size']} msg/txn" for r in results],
        panels=2,
        figsize=(12, 4.8),
        draw=lambda axes: draw(axes, results),
    )


if __name__ == "__main__":
    main()
