"""Kafka's StandardAuthorizer (KIP-801): decides every request from the ACLs in the metadata log, `super.users` and
`allow.everyone.if.no.acl.found`. Pure: the broker hands it the image's ACLs whenever it publishes an image, and
asks it about each request. The rules: docs/security.md#authorizer.

The check runs on every request, so the ACLs are indexed by resource: LITERAL ACLs by (resource type, name), the
wildcard "*" among them; PREFIXED ACLs by (resource type, prefix), with the sorted distinct prefix lengths of each
resource type, so a name is looked up once per length any prefix has rather than against every prefix ACL.
"""

from __future__ import annotations

import bisect
import uuid
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence

from tierlog.metadata.records import AccessControlEntryRecord
from tierlog.security.acl import (
    WILDCARD,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    Action,
    PatternType,
    ResourceType,
)
from tierlog.security.acl_filter import AclBindingFilter, binding_of
from tierlog.security.principal import USER_TYPE, KafkaPrincipal

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# An ACL for this principal applies to every principal.
WILDCARD_PRINCIPAL = f"{USER_TYPE}:{WILDCARD}"

# An ALLOW ACL for any of these operations also allows DESCRIBE; one for ALTER_CONFIGS also DESCRIBE_CONFIGS.
# A DENY ACL denies only its own operation (a DENY of READ leaves DESCRIBE alone), as in Kafka.
_IMPLIES_DESCRIBE = frozenset(
    {AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
)
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})


def parse_super_users(value: str) -> frozenset[str]:
    """`super.users`: principals separated by semicolons ("User:admin;User:ops"), as Kafka reads it."""
    return frozenset(str(KafkaPrincipal.parse(item.strip())) for item in value.split(";") if item.strip())


class StandardAuthorizer:
    def __init__(self, super_users: Collection[str] = (), *, allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._bindings: dict[uuid.UUID, AclBinding] = {}
        self._literal: dict[tuple[ResourceType, str], dict[uuid.UUID, AccessControlEntry]] = {}
        self._prefixed: dict[tuple[ResourceType, str], dict[uuid.UUID, AccessControlEntry]] = {}
        self._prefix_length_counts: dict[ResourceType, Counter[int]] = {}
        self._prefix_lengths: dict[ResourceType, list[int]] = {}

    # The ACLs

    def sync(self, acls: Mapping[uuid.UUID, AccessControlEntryRecord]) -> None:
        """Take on the image's ACLs: an ACL never changes under its id, so only added and removed ids matter."""
        if acls.keys() == self._bindings.keys():
            return
        for acl_id in self._bindings.keys() - acls.keys():
            self.remove_acl(acl_id)
        for acl_id in acls.keys() - self._bindings.keys():
            self.add_acl(acl_id, binding_of(acls[acl_id]))

    def add_acl(self, acl_id: uuid.UUID, binding: AclBinding) -> None:
        self._bindings[acl_id] = binding
        pattern = binding.pattern
        key = (pattern.resource_type, pattern.name)
        if pattern.pattern_type == PatternType.PREFIXED:
            self._prefixed.setdefault(key, {})[acl_id] = binding.entry
            counts = self._prefix_length_counts.setdefault(pattern.resource_type, Counter())
            counts[len(pattern.name)] += 1
            if counts[len(pattern.name)] == 1:
                bisect.insort(self._prefix_lengths.setdefault(pattern.resource_type, []), len(pattern.name))
        else:
            self._literal.setdefault(key, {})[acl_id] = binding.entry

    def remove_acl(self, acl_id: uuid.UUID) -> None:
        binding = self._bindings.pop(acl_id)
        pattern = binding.pattern
        key = (pattern.resource_type, pattern.name)
        index = self._prefixed if pattern.pattern_type == PatternType.PREFIXED else self._literal
        entries = index[key]
        del entries[acl_id]
        if not entries:
            del index[key]
        if pattern.pattern_type == PatternType.PREFIXED:
            counts = self._prefix_length_counts[pattern.resource_type]
            counts[len(pattern.name)] -= 1
            if counts[len(pattern.name)] == 0:
                del counts[len(pattern.name)]
                self._prefix_lengths[pattern.resource_type].remove(len(pattern.name))

    def acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """Every ACL the filter matches (DescribeAcls)."""
        return [binding for binding in self._bindings.values() if acl_filter.matches(binding)]

    # Decisions

    def authorize(self, principal: KafkaPrincipal, host: str, actions: Sequence[Action]) -> list[bool]:
        """One verdict per action. `host` is the client's address, "127.0.0.1" (the "/127.0.0.1" form of
        request_context.client_host() is accepted too)."""
        if str(principal) in self.super_users:
            return [True] * len(actions)
        principals = (str(principal), WILDCARD_PRINCIPAL)
        address = host.removeprefix("/")
        return [self._authorize(principals, address, action) for action in actions]

    def authorize_by_resource_type(
        self, principal: KafkaPrincipal, host: str, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """Whether the principal may do `operation` on some resource of the type (Kafka's default
        Authorizer.authorizeByResourceType, which StandardAuthorizer keeps): a super user (or the no-ACL default)
        may; a LITERAL "*" DENY refuses; a LITERAL "*" ALLOW allows; otherwise some ALLOW that no DENY covers (a
        LITERAL DENY of its name, or a PREFIXED DENY of a prefix of it) allows."""
        if self.authorize(principal, host, [Action(operation, resource_type, "hardcode")])[0]:
            return True
        principals = (str(principal), WILDCARD_PRINCIPAL)
        address = host.removeprefix("/")
        denied: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        allowed: list[tuple[PatternType, str]] = []
        wildcard_allowed = False
        for binding in self._bindings.values():
            pattern, entry = binding.pattern, binding.entry
            if pattern.resource_type != resource_type or entry.principal not in principals:
                continue
            if entry.host not in (WILDCARD, address) or entry.operation not in (operation, AclOperation.ALL):
                continue
            wildcard = pattern.pattern_type == PatternType.LITERAL and pattern.name == WILDCARD
            if entry.permission_type == AclPermissionType.DENY:
                if wildcard:
                    return False
                denied[pattern.pattern_type].add(pattern.name)
            elif wildcard:
                wildcard_allowed = True
            else:
                allowed.append((pattern.pattern_type, pattern.name))
        if wildcard_allowed:
            return True
        for pattern_type, name in allowed:
            if pattern_type == PatternType.LITERAL and name in denied[PatternType.LITERAL]:
                continue
            if not any(name[:length] in denied[PatternType.PREFIXED] for length in range(1, len(name) + 1)):
                return True
        return False

    def _authorize(self, principals: tuple[str, str], host: str, action: Action) -> bool:
        """DENY wins over ALLOW; without any ACL on the resource (for any principal) the default decides; with
        ACLs on it of which none allows, the answer is no."""
        has_resource_acls = False
        allowed = False
        for entries in self._entries_of(action.resource_type, action.resource_name):
            has_resource_acls = True
            for entry in entries:
                verdict = _verdict(entry, action.operation, principals, host)
                if verdict == AclPermissionType.DENY:
                    return False
                if verdict == AclPermissionType.ALLOW:
                    allowed = True
        if allowed:
            return True
        return not has_resource_acls and self.allow_everyone_if_no_acl_found

    def _entries_of(self, resource_type: ResourceType, name: str) -> Iterator[Collection[AccessControlEntry]]:
        """The ACLs of every pattern that covers the resource: its LITERAL name, the LITERAL wildcard, and each
        PREFIXED pattern the name starts with."""
        literal = self._literal.get((resource_type, name))
        if literal:
            yield literal.values()
        if name != WILDCARD:
            wildcard = self._literal.get((resource_type, WILDCARD))
            if wildcard:
                yield wildcard.values()
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            prefixed = self._prefixed.get((resource_type, name[:length]))
            if prefixed:
                yield prefixed.values()


def _verdict(
    entry: AccessControlEntry, operation: AclOperation, principals: tuple[str, str], host: str
) -> AclPermissionType | None:
    """What `entry` says about `operation` by one of `principals` from `host`; None when it does not apply."""
    if entry.principal not in principals:
        return None
    if entry.host != WILDCARD and entry.host != host:
        return None
    if entry.operation != AclOperation.ALL:
        if entry.permission_type == AclPermissionType.ALLOW and operation == AclOperation.DESCRIBE:
            if entry.operation not in _IMPLIES_DESCRIBE:
                return None
        elif entry.permission_type == AclPermissionType.ALLOW and operation == AclOperation.DESCRIBE_CONFIGS:
            if entry.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                return None
        elif entry.operation != operation:
            return None
    return entry.permission_type
