"""The authorized-operations fields of Metadata, DescribeCluster and DescribeGroups (KIP-430).

tierlog has no authorizer, and a Kafka broker without one (`authorizer.class.name` unset) answers a client
that asks with every operation that applies to the resource: KafkaApis' AuthHelper.authorizedOperations
takes AclEntry.supportedOperations of the resource type and sets one bit per AclOperation code
(Utils.to32BitField). A client that does not ask gets Integer.MIN_VALUE, the schemas' default.
"""

from __future__ import annotations

from collections.abc import Iterable

from tierlog.security.acl import AclOperation


def to_32_bit_field(operations: Iterable[AclOperation]) -> int:
    field = 0
    for operation in operations:
        field |= 1 << operation
    return field


# AclEntry.supportedOperations of Kafka 3.x. (Later releases add DESCRIBE_CONFIGS and ALTER_CONFIGS to groups,
# for KIP-848's group configs, which tierlog does not have.)
TOPIC_OPERATIONS = to_32_bit_field(
    (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    )
)
CLUSTER_OPERATIONS = to_32_bit_field(
    (
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    )
)
GROUP_OPERATIONS = to_32_bit_field((AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE))

# What the fields hold when the client did not ask for them.
OMITTED = -(2**31)
