"""AclApis (Kafka's class of that name): DescribeAcls, answered from this broker's authorizer, which follows its
metadata image; CreateAcls and DeleteAcls, which only the controller decides (ControllerApis), forwarded to it.
Without an authorizer all three answer SECURITY_DISABLED, as Kafka does. Rules: docs/security.md#authorizer.
DescribeAcls needs DESCRIBE on the cluster, CreateAcls and DeleteAcls ALTER (docs/security.md#api-checks).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.security.acl import AclBinding, AclOperation
from tierlog.security.acl_filter import acl_binding_filter_of
from tierlog.security.authorizer import StandardAuthorizer
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.controller_apis import API_CREATE_ACLS, API_DELETE_ACLS
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema

API_DESCRIBE_ACLS = 29
CLUSTER_REFUSAL = "Cluster authorization failed."

Handler = Callable[[Request], Awaitable[Any]]


class AclApis:
    def __init__(self, authorizer: StandardAuthorizer | None, auth: AuthHelper, forward: Handler) -> None:
        self._authorizer = authorizer
        self._auth = auth
        self._forward = forward
        self.handlers: dict[int, Handler] = {
            API_DESCRIBE_ACLS: self.handle_describe_acls,
            API_CREATE_ACLS: self.handle_create_acls,
            API_DELETE_ACLS: self.handle_delete_acls,
        }

    @staticmethod
    def _schema(request: Request) -> ResponseSchema:
        return response_schema(request.api_key, request.api_version)

    async def handle_describe_acls(self, request: Request) -> Any:
        s = self._schema(request)
        if not self._auth.authorize_cluster(AclOperation.DESCRIBE):
            return s.DescribeAclsResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"),
                error_message=CLUSTER_REFUSAL,
                resources=(),
            )
        if self._authorizer is None:
            return s.DescribeAclsResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code("SECURITY_DISABLED"),
                error_message="No Authorizer is configured on the broker",
                resources=(),
            )
        acl_filter = acl_binding_filter_of(request.body)
        by_resource: dict[tuple[int, str, int], list[AclBinding]] = {}
        for binding in self._authorizer.acls(acl_filter):
            pattern = binding.pattern
            by_resource.setdefault((pattern.resource_type, pattern.name, pattern.pattern_type), []).append(binding)
        return s.DescribeAclsResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            error_message=None,
            resources=tuple(
                s.DescribeAclsResource(
                    resource_type=resource_type,
                    resource_name=name,
                    pattern_type=pattern_type,
                    acls=tuple(
                        s.AclDescription(
                            principal=b.entry.principal,
                            host=b.entry.host,
                            operation=b.entry.operation,
                            permission_type=b.entry.permission_type,
                        )
                        for b in bindings
                    ),
                )
                for (resource_type, name, pattern_type), bindings in by_resource.items()
            ),
        )

    def _refusal(self) -> tuple[str, str] | None:
        """Why CreateAcls or DeleteAcls is refused as a whole: ALTER on the cluster missing, or no authorizer."""
        if not self._auth.authorize_cluster(AclOperation.ALTER):
            return "CLUSTER_AUTHORIZATION_FAILED", CLUSTER_REFUSAL
        if self._authorizer is None:
            return "SECURITY_DISABLED", "No Authorizer is configured."
        return None

    async def handle_create_acls(self, request: Request) -> Any:
        refusal = self._refusal()
        if refusal is None:
            return await self._forward(request)
        s = self._schema(request)
        return s.CreateAclsResponse(
            throttle_time=NO_THROTTLE,
            results=tuple(
                s.AclCreationResult(error_code=error_code(refusal[0]), error_message=refusal[1])
                for _ in request.body.creations
            ),
        )

    async def handle_delete_acls(self, request: Request) -> Any:
        refusal = self._refusal()
        if refusal is None:
            return await self._forward(request)
        s = self._schema(request)
        return s.DeleteAclsResponse(
            throttle_time=NO_THROTTLE,
            filter_results=tuple(
                s.DeleteAclsFilterResult(error_code=error_code(refusal[0]), error_message=refusal[1], matching_acls=())
                for _ in request.body.filters
            ),
        )
