"""`tierlog log-dirs describe` against a real broker with two log dirs (docs/replication.md#log-dirs), run as a
person runs it: each dir with the partitions it holds and their sizes as on disk, --topic-list and
--broker-list as kafka-log-dirs.sh takes them, `-o json` Kafka's document, errors in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from cli_helpers import tierlog
from cluster_helpers import BrokerFactory


def segment_bytes(partition_dir: Path) -> int:
    return sum(segment.stat().st_size for segment in partition_dir.glob("*.log"))


def test_describe_prints_each_dir_and_partition_with_its_size(
    broker_factory: BrokerFactory, kafka: Any, tmp_path: Path
) -> None:
    dirs = [tmp_path / "disk-a", tmp_path / "disk-b"]
    broker = broker_factory({"log.dirs": ",".join(map(str, dirs))})
    topic = kafka.new_topic(broker.bootstrap, partitions=2)
    other = kafka.new_topic(broker.bootstrap, partitions=1, hint="other")
    kafka.produce(broker.bootstrap, topic, [{"partition": p, "value": b"v" * 50 * (p + 1)} for p in range(2)] * 3)
    b = ("-b", broker.bootstrap)

    ran = tierlog("log-dirs", "describe", *b, "--topic-list", topic)
    assert ran.code == 0, ran.stderr
    assert ran.first_line.split() == ["BROKER", "DIR", "PARTITION", "SIZE", "OFFSET-LAG", "FUTURE"]
    rows = [line.split() for line in ran.stdout.splitlines()[1:]]
    expected = sorted(
        ["1", str(d), p.name, str(segment_bytes(p)), "0", "false"]
        for d in dirs
        for p in d.iterdir()
        if p.is_dir() and p.name.startswith(f"{topic}-")
    )
    assert sorted(rows) == expected
    assert all(int(row[3]) > 0 for row in rows)

    ran = tierlog("log-dirs", "describe", *b, "--topic-list", other, "-o", "wide")
    assert ran.code == 0, ran.stderr
    assert ran.first_line.split() == [
        "BROKER",
        "DIR",
        "PARTITION",
        "SIZE",
        "OFFSET-LAG",
        "FUTURE",
        "DIR-TOTAL",
        "DIR-USABLE",
    ]
    rows = [line.split() for line in ran.stdout.splitlines()[1:]]
    assert sorted(row[1] for row in rows) == sorted(map(str, dirs))  # a dir without the topic is a row of its own
    assert [row[2] for row in rows if row[2] != "-"] == [f"{other}-0"]
    assert all(int(row[-2]) == shutil.disk_usage(row[1]).total for row in rows)

    ran = tierlog("log-dirs", "describe", *b, "--broker-list", "1", "-o", "json")
    assert ran.code == 0, ran.stderr
    document = json.loads(ran.stdout)
    assert document["version"] == 1
    [described] = document["brokers"]
    assert described["broker"] == 1
    assert [d["logDir"] for d in described["logDirs"]] == [str(d) for d in dirs]
    assert all(d["error"] is None for d in described["logDirs"])
    partitions = {p["partition"]: p for d in described["logDirs"] for p in d["partitions"]}
    assert {f"{topic}-0", f"{topic}-1", f"{other}-0"} <= partitions.keys()
    assert partitions[f"{topic}-1"] == {
        "partition": f"{topic}-1",
        "size": next(segment_bytes(d / f"{topic}-1") for d in dirs if (d / f"{topic}-1").exists()),
        "offsetLag": 0,
        "isFuture": False,
    }


def test_describe_of_a_broker_not_in_the_cluster_fails_in_one_line(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    ran = tierlog("log-dirs", "describe", "-b", broker.bootstrap, "--broker-list", "1,7")
    assert ran.code == 1
    assert ran.stderr.strip() == (
        "Error: the given brokers do not exist from --broker-list: 7. Current existent brokers: 1"
    )
    assert tierlog("log-dirs", "describe", "-b", broker.bootstrap, "--broker-list", "one").first_error_line == (
        "Error: --broker-list must be broker ids separated by commas (0,1,2), not 'one'"
    )
