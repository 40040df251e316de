"""AuthHelper (Kafka's class of that name): the one place handlers ask the authorizer whether the principal of the
request may do something, one batched call per question a request asks. Rules: docs/security.md#api-checks.

Without an authorizer (`authorizer.class.name` unset) everything is allowed, as in Kafka. Requests made inside the
broker process (`listener_name()` is "") are the broker's own and are never checked. On a controller listener
only brokers talk (registrations, heartbeats, the metadata fetch, and the admin requests a broker forwards after
checking them with its client's principal): every question there becomes "does the peer hold CLUSTER_ACTION on
the cluster", which is what Kafka's controller asks of each of those requests and of a forwarding Envelope.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from tierlog.config import KafkaConfig
from tierlog.security.acl import CLUSTER_NAME, AclOperation, Action, Authorizer, ResourceType
from tierlog.security.authorizer import StandardAuthorizer, parse_super_users
from tierlog.server.authorized_operations import SUPPORTED_OPERATIONS, to_32_bit_field
from tierlog.server.request_context import client_host, listener_name, principal


def configured_authorizer(config: KafkaConfig) -> StandardAuthorizer | None:
    """Kafka's StandardAuthorizer when authorizer.class.name names it (config.py refuses any other), else None."""
    if not config.get("authorizer.class.name"):
        return None
    return StandardAuthorizer(
        parse_super_users(config.get("super.users")),
        allow_everyone_if_no_acl_found=config.get_bool("allow.everyone.if.no.acl.found"),
    )


class AuthHelper:
    def __init__(self, authorizer: Authorizer | None, controller_listener_names: Collection[str] = ()) -> None:
        self.authorizer = authorizer
        self._controller_listener_names = frozenset(controller_listener_names)

    def _checking_authorizer(self) -> Authorizer | None:
        """The authorizer when the request being served is checked at all (None: no authorizer, or the broker's own
        request)."""
        return self.authorizer if listener_name() else None

    def _ask(self, actions: list[Action]) -> list[bool]:
        """One verdict per action for the request being served (all True when nothing is checked)."""
        authorizer = self._checking_authorizer()
        if authorizer is None or not actions:
            return [True] * len(actions)
        listener = listener_name()
        host = client_host().removeprefix("/")
        if listener in self._controller_listener_names:
            cluster_action = Action(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME)
            (allowed,) = authorizer.authorize(principal(), host, [cluster_action])
            return [allowed] * len(actions)
        return authorizer.authorize(principal(), host, actions)

    def authorize(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        (allowed,) = self._ask([Action(operation, resource_type, name)])
        return allowed

    def authorize_cluster(self, operation: AclOperation) -> bool:
        return self.authorize(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def filter_authorized(self, operation: AclOperation, resource_type: ResourceType, names: Iterable[str]) -> set[str]:
        """The names among `names` the principal may do `operation` on (each asked once)."""
        if self._checking_authorizer() is None:
            # The common case, on the hot path (Produce, Fetch): no Action per name to build and throw away.
            return set(names)
        distinct = list(dict.fromkeys(names))
        verdicts = self._ask([Action(operation, resource_type, name) for name in distinct])
        return {name for name, allowed in zip(distinct, verdicts, strict=True) if allowed}

    def authorize_by_resource_type(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Kafka's Authorizer.authorizeByResourceType: whether the principal may do `operation` on some resource of
        the type (an ALLOW no DENY overrides), e.g. WRITE on any topic for an idempotent producer (KIP-679)."""
        authorizer = self._checking_authorizer()
        if authorizer is None:
            return True
        if listener_name() in self._controller_listener_names:
            return self.authorize_cluster(AclOperation.CLUSTER_ACTION)
        return authorizer.authorize_by_resource_type(
            principal(), client_host().removeprefix("/"), operation, resource_type
        )

    def authorized_operations(self, resource_type: ResourceType, name: str) -> int:
        """KIP-430's bit field: the operations the principal may do on the resource among those it supports
        (all of them without an authorizer)."""
        supported = SUPPORTED_OPERATIONS[resource_type]
        verdicts = self._ask([Action(operation, resource_type, name) for operation in supported])
        return to_32_bit_field(op for op, allowed in zip(supported, verdicts, strict=True) if allowed)
