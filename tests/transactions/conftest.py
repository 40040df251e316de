"""One broker per test module set up for transactions (txn_helpers.BROKER_OVERRIDES: one replica of
__transaction_state and __consumer_offsets, expired transactions looked for every 0.5 s); tests share it and work
on topics, transactional ids and groups of their own."""

from __future__ import annotations

import pytest
from cluster_helpers import BrokerFactory
from txn_helpers import BROKER_OVERRIDES, warm_up_transaction_state

from tierlog.testing.local_cluster import BrokerProcess


@pytest.fixture(scope="module")
def txn_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    broker = module_broker_factory(BROKER_OVERRIDES)
    warm_up_transaction_state(broker.bootstrap)
    return broker
