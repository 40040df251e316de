"""Kafka's AclBindingFilter: which ACLs DescribeAcls shows and DeleteAcls removes, and the conversion between an
`AclBinding` and the metadata log's AccessControlEntryRecord. Rules: docs/security.md#authorizer.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

from tierlog.metadata.records import AccessControlEntryRecord
from tierlog.security.acl import (
    WILDCARD,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

_Code = TypeVar("_Code", bound=IntEnum)


def from_code(enum: type[_Code], code: int) -> _Code:
    """The member with Kafka's `code`; UNKNOWN for a code this version does not know (Kafka's fromCode)."""
    try:
        return enum(code)
    except ValueError:
        return enum["UNKNOWN"]


@dataclass(frozen=True, slots=True)
class ResourcePatternFilter:
    resource_type: ResourceType
    # None matches every name.
    name: str | None
    pattern_type: PatternType

    def is_unknown(self) -> bool:
        return self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN

    def matches(self, pattern: ResourcePattern) -> bool:
        """ANY matches any value. MATCH matches the patterns that would grant access to a resource called
        `name`: that LITERAL name, the LITERAL wildcard "*", and every PREFIXED pattern `name` starts with."""
        if self.resource_type != ResourceType.ANY and self.resource_type != pattern.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != pattern.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        if pattern.pattern_type == PatternType.LITERAL:
            return self.name == pattern.name or pattern.name == WILDCARD
        if pattern.pattern_type == PatternType.PREFIXED:
            return self.name.startswith(pattern.name)
        return False


@dataclass(frozen=True, slots=True)
class AccessControlEntryFilter:
    # None matches every principal, every host.
    principal: str | None
    host: str | None
    operation: AclOperation
    permission_type: AclPermissionType

    def is_unknown(self) -> bool:
        return self.operation == AclOperation.UNKNOWN or self.permission_type == AclPermissionType.UNKNOWN

    def matches(self, entry: AccessControlEntry) -> bool:
        # Exact comparison, as Kafka's: the filter "User:*" finds the ACLs written for "User:*", not every ACL.
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != entry.operation:
            return False
        return self.permission_type == AclPermissionType.ANY or self.permission_type == entry.permission_type


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    pattern: ResourcePatternFilter
    entry: AccessControlEntryFilter

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern.matches(binding.pattern) and self.entry.matches(binding.entry)


# Matches every ACL.
ANY_ACL = AclBindingFilter(
    ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY),
    AccessControlEntryFilter(None, None, AclOperation.ANY, AclPermissionType.ANY),
)


def acl_binding(
    resource_type: int,
    resource_name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission_type: int,
) -> AclBinding:
    """The ACL of a CreateAcls creation or an AccessControlEntryRecord, from its fields (Kafka's codes; a code this
    version does not know is UNKNOWN)."""
    return AclBinding(
        ResourcePattern(from_code(ResourceType, resource_type), resource_name, from_code(PatternType, pattern_type)),
        AccessControlEntry(
            principal, host, from_code(AclOperation, operation), from_code(AclPermissionType, permission_type)
        ),
    )


def binding_of(record: AccessControlEntryRecord) -> AclBinding:
    return acl_binding(
        record.resource_type,
        record.resource_name,
        record.pattern_type,
        record.principal,
        record.host,
        record.operation,
        record.permission_type,
    )


def record_of(acl_id: uuid.UUID, binding: AclBinding) -> AccessControlEntryRecord:
    return AccessControlEntryRecord(
        id=acl_id,
        resource_type=int(binding.pattern.resource_type),
        resource_name=binding.pattern.name,
        pattern_type=int(binding.pattern.pattern_type),
        principal=binding.entry.principal,
        host=binding.entry.host,
        operation=int(binding.entry.operation),
        permission_type=int(binding.entry.permission_type),
    )


def acl_binding_filter(
    resource_type: int,
    resource_name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission_type: int,
) -> AclBindingFilter:
    """The filter of a DescribeAcls or DeleteAcls request, from its fields (Kafka's codes; a code this version
    does not know is UNKNOWN)."""
    return AclBindingFilter(
        ResourcePatternFilter(
            from_code(ResourceType, resource_type), resource_name, from_code(PatternType, pattern_type)
        ),
        AccessControlEntryFilter(
            principal, host, from_code(AclOperation, operation), from_code(AclPermissionType, permission_type)
        ),
    )


def acl_binding_filter_of(request_filter: Any) -> AclBindingFilter:
    """The filter of a DescribeAcls request or of one of a DeleteAcls request's filters (their fields are named
    alike)."""
    return acl_binding_filter(
        request_filter.resource_type_filter,
        request_filter.resource_name_filter,
        request_filter.pattern_type_filter,
        request_filter.principal_filter,
        request_filter.host_filter,
        request_filter.operation,
        request_filter.permission_type,
    )
