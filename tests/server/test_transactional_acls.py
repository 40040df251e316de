"""ACLs of the transactional data path on a whole broker in this process with the StandardAuthorizer
(docs/transactions.md#produce, #write-txn-markers): a Produce with transactional batches needs WRITE on its
transactional id, or every partition of it is refused; WriteTxnMarkers needs ALTER or CLUSTER_ACTION on the
cluster, or every partition of it is answered CLUSTER_AUTHORIZATION_FAILED."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce_v9
from kio.schema.write_txn_markers.v1 import request as write_txn_markers_v1

from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.records.codec import build_batch
from tierlog.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierlog.security.authorizer import STANDARD_AUTHORIZER
from tierlog.security.principal import KafkaPrincipal
from tierlog.server import request_context
from tierlog.server.broker import Broker
from tierlog.server.clock import now_ms
from tierlog.server.kafka_apis import API_PRODUCE, KafkaApis
from tierlog.server.txn_marker_apis import API_WRITE_TXN_MARKERS

TOPIC = "events"
PRODUCER = 9000


def allow(principal: str, operation: AclOperation, resource_type: ResourceType, name: str) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, PatternType.LITERAL),
        AccessControlEntry(principal, "*", operation, AclPermissionType.ALLOW),
    )


ACLS = [
    allow("User:alice", AclOperation.WRITE, ResourceType.TOPIC, TOPIC),
    allow("User:alice", AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, "alice-txn"),
    allow("User:broker", AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME),
    allow("User:operator", AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME),
]


def run_as_clients(tmp_path: Path, test: Any) -> None:
    """A broker with the authorizer and `ACLS`, topic `events` of 2 partitions; the test's requests come in on the
    PLAINTEXT listener from the principal it names."""

    async def main() -> None:
        config = KafkaConfig(
            {
                "log.dirs": str(tmp_path),
                "listeners": "PLAINTEXT://127.0.0.1:0",
                "auto.create.topics.enable": "false",
                "authorizer.class.name": STANDARD_AUTHORIZER,
                "super.users": "User:admin",
            }
        )
        broker = Broker(config)
        async with asyncio.timeout(30):
            await broker.start()
        try:
            controller = broker.controller_server.controller
            controller.create_topic(TOPIC, 2, 1, {})
            assert controller.create_acls(ACLS) == [None] * len(ACLS)
            await broker.forwarding_manager.sync_metadata()
            request_context.enter_connection("/127.0.0.1", "PLAINTEXT")
            async with asyncio.timeout(60):
                await test(broker.apis)
        finally:
            await broker.stop()

    asyncio.run(main())


async def call_as(principal: str, apis: KafkaApis, api_key: int, version: int, body: Any) -> Any:
    request_context.authenticated_as(KafkaPrincipal.parse(principal))
    return await apis.handle(Request(api_key, version, 7, "test", body, 0))


def produce_request(transactional_id: str | None) -> Any:
    """Partition 0: a transactional batch; partition 1: a plain one."""
    transactional = build_batch(
        [(None, b"t", [], now_ms())], producer_id=PRODUCER, producer_epoch=0, base_sequence=0, transactional=True
    )
    plain = build_batch([(None, b"p", [], now_ms())])
    return produce_v9.ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            produce_v9.TopicProduceData(
                name=TOPIC,
                partition_data=(
                    produce_v9.PartitionProduceData(index=0, records=transactional),
                    produce_v9.PartitionProduceData(index=1, records=plain),
                ),
            ),
        ),
    )


def produce_errors(response: Any) -> list[ErrorCode]:
    (topic,) = response.responses
    return [p.error_code for p in sorted(topic.partition_responses, key=lambda p: p.index)]


def markers_request(producer_id: int) -> Any:
    return write_txn_markers_v1.WriteTxnMarkersRequest(
        markers=(
            write_txn_markers_v1.WritableTxnMarker(
                producer_id=producer_id,
                producer_epoch=0,
                transaction_result=True,
                topics=(write_txn_markers_v1.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=(0,)),),
                coordinator_epoch=0,
            ),
        )
    )


def marker_errors(response: Any) -> list[tuple[int, int, ErrorCode]]:
    return [
        (marker.producer_id, partition.partition_index, partition.error_code)
        for marker in response.markers
        for topic in marker.topics
        for partition in topic.partitions
    ]


def test_transactional_produce_needs_write_on_its_transactional_id(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        refused = ErrorCode.transactional_id_authorization_failed
        for transactional_id in ("bob-txn", None):
            response = await call_as("User:alice", apis, API_PRODUCE, 9, produce_request(transactional_id))
            # The whole request, the plain batch too.
            assert produce_errors(response) == [refused, refused], transactional_id
        response = await call_as("User:alice", apis, API_PRODUCE, 9, produce_request("alice-txn"))
        assert produce_errors(response) == [ErrorCode.none, ErrorCode.none]

    run_as_clients(tmp_path, test)


def test_write_txn_markers_needs_cluster_action_or_alter_on_the_cluster(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        assert produce_errors(await call_as("User:alice", apis, API_PRODUCE, 9, produce_request("alice-txn"))) == [
            ErrorCode.none,
            ErrorCode.none,
        ]
        answer = await call_as("User:alice", apis, API_WRITE_TXN_MARKERS, 1, markers_request(PRODUCER))
        assert marker_errors(answer) == [(PRODUCER, 0, ErrorCode.cluster_authorization_failed)]
        answer = await call_as("User:broker", apis, API_WRITE_TXN_MARKERS, 1, markers_request(PRODUCER))
        assert marker_errors(answer) == [(PRODUCER, 0, ErrorCode.none)]
        answer = await call_as("User:operator", apis, API_WRITE_TXN_MARKERS, 1, markers_request(PRODUCER + 1))
        assert marker_errors(answer) == [(PRODUCER + 1, 0, ErrorCode.none)]

    run_as_clients(tmp_path, test)
