"""Where a transactional id's coordinator lives is Kafka's rule, so Kafka's tools and a mixed reading of
`__transaction_state` agree with tierlog: partition Utils.abs(transactionalId.hashCode) % partitions, with Kafka's
Utils.abs (`n == Integer.MIN_VALUE ? 0 : Math.abs(n)`, TransactionStateManager.partitionFor). Ids with a negative
hashCode are where a `& 0x7fffffff` would differ (docs/transactions.md#proof)."""

from __future__ import annotations

import pytest
from txn_helpers import java_string_hash, state_partition

from tierlog.coordinator.transaction.records import partition_for


@pytest.mark.parametrize("transactional_id", ["my-txn", "zzzzzz", "aaaaaaa", "polygenelubricants", "processor-1"])
def test_a_transactional_id_maps_to_kafka_s_transaction_state_partition(transactional_id: str) -> None:
    expected = state_partition(transactional_id, 50)
    assert partition_for(transactional_id, 50) == expected, (transactional_id, java_string_hash(transactional_id))


def test_kafka_s_placement_of_known_ids() -> None:
    # "my-txn".hashCode() == -1061187895: Math.abs gives 1061187895, % 50 = 45 (& 0x7fffffff would give 3).
    assert java_string_hash("my-txn") == -1061187895
    assert state_partition("my-txn", 50) == 45
