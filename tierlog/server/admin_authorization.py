"""What the admin requests only the controller decides need: CreateTopics, DeleteTopics, CreatePartitions,
ElectLeaders, AlterUserScramCredentials, AlterPartitionReassignments, ListPartitionReassignments and
UnregisterBroker (Kafka's ControllerApis checks them; rules: docs/security.md#api-checks).

Kafka forwards these to the controller in an Envelope that carries the client's principal, and the controller
checks them. tierlog forwards the request alone, so the broker the client asked checks it with the client's
principal, forwards only what passed, and adds the refusals to the controller's answer.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from tierlog.metadata.image import ClusterMetadata
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.security.acl import AclOperation, ResourceType
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.controller_apis import (
    API_ALTER_PARTITION_REASSIGNMENTS,
    API_CREATE_PARTITIONS,
    API_CREATE_TOPICS,
    API_DELETE_TOPICS,
    API_ELECT_LEADERS,
    API_LIST_PARTITION_REASSIGNMENTS,
    API_UNREGISTER_BROKER,
    alter_partition_reassignments_refused,
    list_partition_reassignments_refused,
)
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema

Forward = Callable[[Request], Awaitable[Any]]


async def forward_authorized(auth: AuthHelper, image: ClusterMetadata, request: Request, forward: Forward) -> Any:
    """The answer to an admin request (one of CHECKED_ADMIN_APIS): the controller's for what the principal may
    do, refusals for the rest."""
    s = response_schema(request.api_key, request.api_version)
    return await _CHECKS[request.api_key](auth, image, s, request, forward)


async def _forward_remaining(request: Request, forward: Forward, field: str, remaining: list[Any]) -> Any:
    return await forward(
        dataclasses.replace(request, body=dataclasses.replace(request.body, **{field: tuple(remaining)}))
    )


async def _create_topics(
    auth: AuthHelper, _image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """CREATE on the cluster or on the topic; the response's configs need DESCRIBE_CONFIGS on the topic."""
    names = [t.name for t in request.body.topics]
    if auth.authorize_cluster(AclOperation.CREATE):
        creatable = set(names)
    else:
        creatable = auth.filter_authorized(AclOperation.CREATE, ResourceType.TOPIC, names)
    describable = auth.filter_authorized(AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, creatable)
    response = await _forward_remaining(
        request, forward, "topics", [t for t in request.body.topics if t.name in creatable]
    )
    # v5+ answer a created topic's configs; without DESCRIBE_CONFIGS they stay unsaid.
    hidden_configs = {
        "configs": (),
        "num_partitions": -1,
        "replication_factor": -1,
        "topic_config_error_code": error_code("TOPIC_AUTHORIZATION_FAILED"),
    }
    results = [
        result
        if result.name in describable or result.error_code != error_code(None)
        else dataclasses.replace(
            result, **{k: v for k, v in hidden_configs.items() if k in {f.name for f in dataclasses.fields(result)}}
        )
        for result in response.topics
    ]
    results += [
        s.CreatableTopicResult(
            name=name,
            topic_id=uuid.UUID(int=0),
            error_code=error_code("TOPIC_AUTHORIZATION_FAILED"),
            error_message="Authorization failed.",
            topic_config_error_code=0,
            num_partitions=-1,
            replication_factor=-1,
            configs=None,
        )
        for name in dict.fromkeys(names)
        if name not in creatable
    ]
    return dataclasses.replace(response, topics=tuple(results))


async def _delete_topics(
    auth: AuthHelper, image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """DELETE on the cluster, or DELETE on the topic. A topic the principal may not describe is refused before
    anyone looks whether it exists (and, named by id, its name is not told)."""
    body = request.body
    by_id = hasattr(body, "topics")  # v6+ names each topic or gives its id
    entries = list(body.topics) if by_id else list(body.topic_names)

    def name_of(entry: Any) -> str | None:
        if not by_id:
            return entry
        if entry.name is not None:
            return entry.name
        topic = image.topic_by_id(entry.topic_id)
        return topic.name if topic is not None else None

    names = [name for entry in entries if (name := name_of(entry)) is not None]
    if auth.authorize_cluster(AclOperation.DELETE):
        describable = deletable = set(names)
    else:
        describable = auth.filter_authorized(AclOperation.DESCRIBE, ResourceType.TOPIC, names)
        deletable = auth.filter_authorized(AclOperation.DELETE, ResourceType.TOPIC, names)
    remaining, refused = [], []
    for entry in entries:
        name = name_of(entry)
        # Unknown ids, and unknown names the principal may describe, are the controller's to answer.
        unknown = name is None or (name in describable and name not in image.topics)
        if unknown or name in deletable:
            remaining.append(entry)
            continue
        named_by_id = by_id and entry.name is None
        refused.append(
            s.DeletableTopicResult(
                name=None if named_by_id and name not in describable else name,
                topic_id=entry.topic_id if named_by_id else uuid.UUID(int=0),
                error_code=error_code("TOPIC_AUTHORIZATION_FAILED"),
                error_message=None,
            )
        )
    response = await _forward_remaining(request, forward, "topics" if by_id else "topic_names", remaining)
    return dataclasses.replace(response, responses=tuple(response.responses) + tuple(refused))


async def _create_partitions(
    auth: AuthHelper, _image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """ALTER on the topic."""
    alterable = auth.filter_authorized(AclOperation.ALTER, ResourceType.TOPIC, (t.name for t in request.body.topics))
    remaining = [t for t in request.body.topics if t.name in alterable]
    response = await _forward_remaining(request, forward, "topics", remaining)
    refused = [
        s.CreatePartitionsTopicResult(
            name=name, error_code=error_code("TOPIC_AUTHORIZATION_FAILED"), error_message=None
        )
        for name in dict.fromkeys(t.name for t in request.body.topics)
        if name not in alterable
    ]
    return dataclasses.replace(response, results=tuple(response.results) + tuple(refused))


async def _elect_leaders(
    auth: AuthHelper, _image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """ALTER on the cluster, else the whole request is refused, with each partition it names
    (Kafka's ElectLeadersRequest.getErrorResponse)."""
    if auth.authorize_cluster(AclOperation.ALTER):
        return await forward(request)
    refused = error_code("CLUSTER_AUTHORIZATION_FAILED")
    return s.ElectLeadersResponse(
        throttle_time=NO_THROTTLE,
        error_code=refused,
        replica_election_results=tuple(
            s.ReplicaElectionResult(
                topic=t.topic,
                partition_result=tuple(
                    s.PartitionResult(partition_id=p, error_code=refused, error_message="Cluster authorization failed.")
                    for p in t.partitions
                ),
            )
            for t in request.body.topic_partitions or ()
        ),
    )


async def _alter_user_scram_credentials(
    auth: AuthHelper, _image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """ALTER on the cluster, else every user named is refused (Kafka's AlterUserScramCredentialsRequest
    .getErrorResponse: each distinct user once, sorted)."""
    if auth.authorize_cluster(AclOperation.ALTER):
        return await forward(request)
    users = sorted({d.name for d in request.body.deletions} | {u.name for u in request.body.upsertions})
    return s.AlterUserScramCredentialsResponse(
        throttle_time=NO_THROTTLE,
        results=tuple(
            s.AlterUserScramCredentialsResult(
                user=user,
                error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"),
                error_message="Cluster authorization failed.",
            )
            for user in users
        ),
    )


async def _alter_partition_reassignments(
    auth: AuthHelper, _image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """ALTER on the cluster, else the whole request is refused."""
    if auth.authorize_cluster(AclOperation.ALTER):
        return await forward(request)
    return alter_partition_reassignments_refused(s, request, "CLUSTER_AUTHORIZATION_FAILED", _CLUSTER_REFUSAL)


async def _list_partition_reassignments(
    auth: AuthHelper, _image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """DESCRIBE on the cluster, else the whole request is refused."""
    if auth.authorize_cluster(AclOperation.DESCRIBE):
        return await forward(request)
    return list_partition_reassignments_refused(s, request, "CLUSTER_AUTHORIZATION_FAILED", _CLUSTER_REFUSAL)


async def _unregister_broker(
    auth: AuthHelper, _image: ClusterMetadata, s: ResponseSchema, request: Request, forward: Forward
) -> Any:
    """ALTER on the cluster (Kafka's UnregisterBrokerRequest.getErrorResponse: the error code alone)."""
    if auth.authorize_cluster(AclOperation.ALTER):
        return await forward(request)
    return s.UnregisterBrokerResponse(
        throttle_time=NO_THROTTLE, error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"), error_message=None
    )


_CLUSTER_REFUSAL = "Cluster authorization failed."
API_ALTER_USER_SCRAM_CREDENTIALS = 51

_CHECKS: dict[int, Callable[[AuthHelper, ClusterMetadata, ResponseSchema, Request, Forward], Awaitable[Any]]] = {
    API_CREATE_TOPICS: _create_topics,
    API_DELETE_TOPICS: _delete_topics,
    API_CREATE_PARTITIONS: _create_partitions,
    API_ELECT_LEADERS: _elect_leaders,
    API_ALTER_USER_SCRAM_CREDENTIALS: _alter_user_scram_credentials,
    API_ALTER_PARTITION_REASSIGNMENTS: _alter_partition_reassignments,
    API_LIST_PARTITION_REASSIGNMENTS: _list_partition_reassignments,
    API_UNREGISTER_BROKER: _unregister_broker,
}
# The admin requests whose checks are here; KafkaApis sends those it serves through `forward_authorized`.
CHECKED_ADMIN_APIS = frozenset(_CHECKS)
