"""What the transaction APIs check (docs/transactions.md#txn-apis, docs/security.md#api-checks), on a whole broker
in this process with the StandardAuthorizer: a principal without the ACLs Kafka's KafkaApis asks for gets Kafka's
*_AUTHORIZATION_FAILED codes, one with them is served; DescribeTransactions leaves out the partitions of topics the
principal may not describe and ListTransactions the ids it may not describe."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from test_api_authorization import ADMIN, TOPIC, InProcessBroker, acl

from tierlog.client.requests import request_schema
from tierlog.security.acl import AclOperation, ResourceType
from tierlog.security.principal import KafkaPrincipal

Op, Type = AclOperation, ResourceType
TXN = "t-acl"
GROUP = "g-acl"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    running = InProcessBroker(tmp_path_factory.mktemp("transactions-authorized"))
    try:
        yield running
    finally:
        running.close()


def until(broker: InProcessBroker, call: Any, retriable: tuple[ErrorCode, ...], code: Any) -> Any:
    """`call()`'s answer once `code(answer)` is not retriable (the coordinator's topic being created or loaded)."""
    for _ in range(200):
        answer = call()
        if code(answer) not in retriable:
            return answer
        broker.run(asyncio.sleep(0.05))
    raise AssertionError(f"still {code(answer)}")


def find(broker: InProcessBroker, who: KafkaPrincipal) -> ErrorCode:
    body = request_schema(10, 4).FindCoordinatorRequest(key_type=1, coordinator_keys=(TXN,))
    answer = until(
        broker,
        lambda: broker.call(who, 10, 4, body),
        (ErrorCode.coordinator_not_available,),
        lambda a: a.coordinators[0].error_code,
    )
    return answer.coordinators[0].error_code


def init(broker: InProcessBroker, who: KafkaPrincipal, txn: str = TXN) -> Any:
    body = request_schema(22, 4).InitProducerIdRequest(
        transactional_id=txn, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1
    )
    return until(
        broker,
        lambda: broker.call(who, 22, 4, body),
        (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator, ErrorCode.coordinator_not_available),
        lambda a: a.error_code,
    )


def add_partitions(broker: InProcessBroker, who: KafkaPrincipal, producer: Any) -> dict[str, ErrorCode]:
    s = request_schema(24, 3)
    body = s.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TXN,
        v3_and_below_producer_id=producer.producer_id,
        v3_and_below_producer_epoch=producer.producer_epoch,
        v3_and_below_topics=(s.AddPartitionsToTxnTopic(name=TOPIC, partitions=(0,)),),
    )
    answer = broker.call(who, 24, 3, body)
    return {
        t.name: p.partition_error_code for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition
    }


def add_offsets(broker: InProcessBroker, who: KafkaPrincipal, producer: Any) -> ErrorCode:
    body = request_schema(25, 3).AddOffsetsToTxnRequest(
        transactional_id=TXN, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch, group_id=GROUP
    )
    return broker.call(who, 25, 3, body).error_code


def end(broker: InProcessBroker, who: KafkaPrincipal, producer: Any) -> ErrorCode:
    body = request_schema(26, 3).EndTxnRequest(
        transactional_id=TXN, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch, committed=False
    )
    return broker.call(who, 26, 3, body).error_code


def describe(broker: InProcessBroker, who: KafkaPrincipal) -> Any:
    body = request_schema(65, 0).DescribeTransactionsRequest(transactional_ids=(TXN,))
    return broker.call(who, 65, 0, body).transaction_states[0]


def listed(broker: InProcessBroker, who: KafkaPrincipal) -> list[str]:
    body = request_schema(66, 0).ListTransactionsRequest(state_filters=(), producer_id_filters=())
    return sorted(t.transactional_id for t in broker.call(who, 66, 0, body).transaction_states)


def test_each_transaction_api_asks_what_kafka_asks(broker: InProcessBroker) -> None:
    stranger = KafkaPrincipal("User", "stranger")
    producer_principal = KafkaPrincipal("User", "txn-producer")
    assert find(broker, ADMIN) == ErrorCode.none  # __transaction_state exists from here
    admins = init(broker, ADMIN, "t-admin-only")
    assert admins.error_code == ErrorCode.none

    refused = ErrorCode.transactional_id_authorization_failed
    assert find(broker, stranger) == refused
    assert init(broker, stranger).error_code == refused
    fake = admins  # any producer id: the id is refused before the coordinator looks
    assert add_partitions(broker, stranger, fake) == {TOPIC: refused}
    assert add_offsets(broker, stranger, fake) == refused
    assert end(broker, stranger, fake) == refused
    assert describe(broker, stranger).error_code == refused
    assert listed(broker, stranger) == []

    broker.grant(
        acl(producer_principal, Op.WRITE, Type.TRANSACTIONAL_ID, TXN),
        acl(producer_principal, Op.DESCRIBE, Type.TRANSACTIONAL_ID, TXN),
    )
    assert find(broker, producer_principal) == ErrorCode.none
    producer = init(broker, producer_principal)
    assert producer.error_code == ErrorCode.none
    assert add_partitions(broker, producer_principal, producer) == {TOPIC: ErrorCode.topic_authorization_failed}
    broker.grant(acl(producer_principal, Op.WRITE, Type.TOPIC, TOPIC))
    assert add_partitions(broker, producer_principal, producer) == {TOPIC: ErrorCode.none}
    assert add_offsets(broker, producer_principal, producer) == ErrorCode.group_authorization_failed
    broker.grant(acl(producer_principal, Op.READ, Type.GROUP, GROUP))
    assert add_offsets(broker, producer_principal, producer) == ErrorCode.none

    # WRITE on the topic implies DESCRIBE; nothing lets it describe __consumer_offsets, whose partition is left out.
    state = describe(broker, producer_principal)
    assert (state.error_code, state.transaction_state) == (ErrorCode.none, "Ongoing")
    assert [(t.topic, t.partitions) for t in state.topics] == [(TOPIC, (0,))]
    assert {t.topic for t in describe(broker, ADMIN).topics} == {TOPIC, "__consumer_offsets"}
    # The admin's own id is not the producer's to see.
    assert listed(broker, producer_principal) == [TXN]
    assert listed(broker, ADMIN) == [TXN, "t-admin-only"]
    assert end(broker, producer_principal, producer) == ErrorCode.none
