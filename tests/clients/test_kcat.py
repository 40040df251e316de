"""kcat (librdkafka's command-line client) against a real broker: metadata, offsets by time, consuming from a
timestamp or a relative offset (its produce/consume round trip is in test_round_trip.py)."""

from __future__ import annotations

import subprocess
from typing import Any

from tierlog.testing.local_cluster import BrokerProcess

BASE_TS = 1_700_000_000_000


def kcat(*args: str, stdin: bytes = b"", timeout_s: float = 30) -> str:
    done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}: {done.stderr.decode()}"
    return done.stdout.decode()


def test_kcat_metadata_lists_the_broker_and_the_topic(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=3)
    listing = kcat("-L", "-b", shared_broker.bootstrap, "-t", topic)
    assert f"broker 1 at 127.0.0.1:{shared_broker.port}" in listing
    assert f'topic "{topic}" with 3 partitions:' in listing
    for partition in range(3):
        assert f"partition {partition}, leader 1, replicas: 1, isrs: 1" in listing


def test_kcat_query_finds_offsets_by_timestamp(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"v", "timestamp": BASE_TS + i * 10} for i in range(30)])
    out = kcat("-Q", "-b", shared_broker.bootstrap, "-t", f"{topic}:0:{BASE_TS + 125}")
    assert f"{topic} [0] offset 13" in out


def test_kcat_consumes_from_timestamp_and_relative_offsets(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    kafka.produce(
        shared_broker.bootstrap, topic, [{"value": b"m%d" % i, "timestamp": BASE_TS + i * 10} for i in range(30)]
    )
    common = ["-C", "-b", shared_broker.bootstrap, "-t", topic, "-p", "0", "-e", "-q", "-f", "%o:%s\\n"]
    assert kcat(*common, "-o", f"s@{BASE_TS + 250}").split() == [f"{i}:m{i}" for i in range(25, 30)]
    assert kcat(*common, "-o", "-3").split() == ["27:m27", "28:m28", "29:m29"]
