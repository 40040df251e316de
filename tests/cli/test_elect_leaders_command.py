"""`tierlog cluster elect-leaders` against a real broker: Kafka's wording of what was elected and what needed no
election, and one-line errors (the leaders it moves are tested on three brokers in
tests/cluster/test_elect_leaders.py)."""

from __future__ import annotations

from cli_helpers import tierlog
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import BrokerProcess


def test_partitions_already_led_by_their_preferred_replica_need_no_election(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("orders", num_partitions=2, replication_factor=1)])["orders"].result(15)

    one = tierlog("cluster", "elect-leaders", "--topic", "orders", "--partition", "1", "-b", broker.bootstrap)
    assert (one.code, one.stdout) == (0, "Valid replica already elected for partitions orders-1\n")

    unclean = tierlog("cluster", "elect-leaders", "--type", "unclean", "--topic", "orders", "-b", broker.bootstrap)
    assert (unclean.code, unclean.stdout) == (0, "Valid replica already elected for partitions orders-0, orders-1\n")

    every = tierlog("cluster", "elect-leaders", "-b", broker.bootstrap)
    assert (every.code, every.stdout) == (0, "No partition needed a leader election (PREFERRED)\n")


def test_a_partition_that_does_not_exist_is_one_line_and_exit_1(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("orders", num_partitions=1, replication_factor=1)])["orders"].result(15)
    ran = tierlog("cluster", "elect-leaders", "--topic", "orders", "--partition", "4", "-b", broker.bootstrap)
    assert ran.code == 1
    assert ran.stdout.splitlines()[0].startswith("Error completing leader election (PREFERRED) for partition orders-4:")
    assert ran.first_error_line == "Error: 1 partition(s) could not be elected"

    missing = tierlog("cluster", "elect-leaders", "--topic", "nope", "-b", broker.bootstrap)
    assert missing.code == 1
    assert missing.first_error_line == "Error: topic 'nope' does not exist (`tierlog topic list` shows the topics)"


def test_partition_without_topic_is_a_usage_error() -> None:
    ran = tierlog("cluster", "elect-leaders", "--partition", "0", "-b", "127.0.0.1:1")
    assert ran.code == 2
    assert "--partition needs --topic" in ran.stderr
