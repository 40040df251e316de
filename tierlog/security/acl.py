"""Kafka's ACL vocabulary, with Kafka's numeric codes (they travel in CreateAcls, DescribeAcls, DeleteAcls and the
metadata log): resource types, pattern types, operations, permission types, and the `Authorizer` every API
asks. Rules: docs/security.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from tierlog.security.principal import KafkaPrincipal


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# The cluster resource's only name (Kafka's Resource.CLUSTER_NAME).
CLUSTER_NAME = "kafka-cluster"
# In a LITERAL pattern, the name that matches every resource (ResourcePattern.WILDCARD_RESOURCE); as a host, every host.
WILDCARD = "*"


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    # "User:alice", or "User:*" for every principal.
    principal: str
    # A client address as the broker sees it ("127.0.0.1"), or "*".
    host: str
    operation: AclOperation
    permission_type: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry


@dataclass(frozen=True, slots=True)
class Action:
    """One thing a request wants to do: `operation` on the resource named `resource_name` of `resource_type`."""

    operation: AclOperation
    resource_type: ResourceType
    resource_name: str


class Authorizer(Protocol):
    def authorize(self, principal: KafkaPrincipal, host: str, actions: Sequence[Action]) -> list[bool]:
        """One verdict per action: True when `principal` connecting from `host` may do it."""
        ...

    def authorize_by_resource_type(
        self, principal: KafkaPrincipal, host: str, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """Whether `principal` may do `operation` on at least one resource of `resource_type` (Kafka's
        Authorizer.authorizeByResourceType; an idempotent producer's InitProducerId asks it of WRITE on topics)."""
        ...
