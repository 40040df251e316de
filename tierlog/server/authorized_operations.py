"""The authorized-operations fields of Metadata, DescribeCluster and DescribeGroups (KIP-430).

A client that asks gets one bit per AclOperation code (Utils.to32BitField) for each operation the resource type
supports (Kafka's AclEntry.supportedOperations) that its principal may do: with an authorizer, the ones it
allows (AuthHelper.authorized_operations); without one, all of them, as a Kafka broker without
`authorizer.class.name` answers. A client that does not ask gets Integer.MIN_VALUE, the schemas' default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from tierlog.security.acl import AclOperation, ResourceType


def to_32_bit_field(operations: Iterable[AclOperation]) -> int:
    field = 0
    for operation in operations:
        field |= 1 << operation
    return field


# AclEntry.supportedOperations of Kafka 3.x. (Later releases add DESCRIBE_CONFIGS and ALTER_CONFIGS to groups,
# for KIP-848's group configs, which tierlog does not have.)
SUPPORTED_OPERATIONS: Mapping[ResourceType, tuple[AclOperation, ...]] = MappingProxyType(
    {
        ResourceType.TOPIC: (
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.CREATE,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        ),
        ResourceType.CLUSTER: (
            AclOperation.CREATE,
            AclOperation.CLUSTER_ACTION,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
            AclOperation.IDEMPOTENT_WRITE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
        ),
        ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    }
)

# What the fields hold when the client did not ask for them.
OMITTED = -(2**31)
