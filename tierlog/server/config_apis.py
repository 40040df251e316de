"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and brokers (Kafka's ConfigHelper and
ConfigAdminManager).

Topic configs are decided by the controller (a broker that is not the controller forwards them). Broker
configs are dynamic broker configs: the broker that receives the request checks them first, as Kafka's
ConfigAdminManager does (the resource names this broker or "" for the cluster-wide default, only configs
tierlog applies while it runs, valid values), then the controller stores them in the metadata log and every
broker applies them when its metadata shows them (docs/configuration.md). Describing needs DESCRIBE_CONFIGS and
altering ALTER_CONFIGS, on the cluster for broker configs and on the topic for topic configs
(docs/security.md#api-checks).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tierlog.config import BROKER_CONFIGS, SOURCE_DEFAULT_CONFIG, KafkaConfig
from tierlog.config_def import ConfigDef, ConfigException, render
from tierlog.controller.controller import Controller
from tierlog.controller.errors import ControllerError
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import RESOURCE_BROKER, RESOURCE_TOPIC
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.security.acl import AclOperation, ResourceType
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.controller_channel import ControllerChannel
from tierlog.server.controller_server import ControllerServer
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema
from tierlog.server.request_context import listener_name
from tierlog.storage.log_config import ALL_TOPIC_CONFIGS

logger = logging.getLogger(__name__)

API_DESCRIBE_CONFIGS = 32
API_ALTER_CONFIGS = 33
API_INCREMENTAL_ALTER_CONFIGS = 44

# DescribeConfigs ConfigType values, by Kafka's ConfigDef type name (UNKNOWN is 0).
CONFIG_TYPES = {
    "boolean": 1,
    "string": 2,
    "int": 3,
    "short": 4,
    "long": 5,
    "double": 6,
    "list": 7,
    "class": 8,
    "password": 9,
}

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

# A resource's outcome: None for success, else (error name, message).
Outcome = tuple[str, str] | None


class ConfigRequestError(Exception):
    """A resource of an AlterConfigs request that cannot be applied; Kafka's error name and message."""

    def __init__(self, error_name: str, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


class ConfigApis:
    def __init__(
        self,
        config: KafkaConfig,
        image: Callable[[], ClusterMetadata],
        controller_server: ControllerServer | None,
        channel: ControllerChannel | None,
        sync_metadata: Callable[[], Awaitable[None]],
        auth: AuthHelper,
    ) -> None:
        self.config = config
        self.auth = auth
        self._image = image
        # Set on a controller's node, where requests are decided while its controller is the active one.
        self._controller_server = controller_server
        # A broker's way to the active controller; None on a dedicated controller, which serves only controller
        # listeners, where every request counts as forwarded (docs/configuration.md#dedicated-controllers).
        self._channel = channel
        self._sync_metadata = sync_metadata
        self.handlers: dict[int, Callable[[Request], Awaitable[Any]]] = {
            API_DESCRIBE_CONFIGS: self.handle_describe_configs,
            API_ALTER_CONFIGS: self.handle_alter_configs,
            API_INCREMENTAL_ALTER_CONFIGS: self.handle_incremental_alter_configs,
        }

    @property
    def node_id(self) -> int:
        return self.config.node_id

    # DescribeConfigs

    async def handle_describe_configs(self, request: Request) -> Any:
        s = response_schema(request.api_key, request.api_version)
        body = request.body
        results = []
        for resource in body.resources:
            keys = set(resource.configuration_keys) if resource.configuration_keys else None
            entries: list[Any] = []
            error, message = None, None
            try:
                for described in self._describe(resource.resource_type, resource.resource_name):
                    if keys is None or described.name in keys:
                        entries.append(_entry(s, described, body))
            except ConfigRequestError as e:
                error, message = e.error_name, str(e)
            results.append(
                s.DescribeConfigsResult(
                    error_code=error_code(error),
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=tuple(entries),
                )
            )
        return s.DescribeConfigsResponse(throttle_time=NO_THROTTLE, results=tuple(results))

    def _describe(self, resource_type: int, name: str) -> list[Any]:
        self._authorize(AclOperation.DESCRIBE_CONFIGS, resource_type, name)
        if resource_type == RESOURCE_TOPIC:
            topic = self._image().topics.get(name)
            if topic is None:
                raise ConfigRequestError("UNKNOWN_TOPIC_OR_PARTITION", f"Topic '{name}' does not exist.")
            return self.config.describe_topic(topic.configs)
        if resource_type == RESOURCE_BROKER:
            if not name:
                return self.config.describe_broker(per_broker=False)
            if not name.lstrip("-").isdigit():
                raise ConfigRequestError("INVALID_REQUEST", f"Broker id must be an integer, but it is: {name}")
            if int(name) != self.node_id:
                raise ConfigRequestError(
                    "INVALID_REQUEST",
                    f"Unexpected broker id, expected {self.node_id} or empty string, but received {name}",
                )
            return self.config.describe_broker(per_broker=True)
        raise ConfigRequestError("INVALID_REQUEST", f"Unsupported resource type {resource_type}")

    # AlterConfigs, IncrementalAlterConfigs

    async def handle_alter_configs(self, request: Request) -> Any:
        """The legacy API replaces every config of the resource with the ones given."""
        responses = await self._alter_configs(request, _replace_configs)
        s = response_schema(request.api_key, request.api_version)
        return s.AlterConfigsResponse(throttle_time=NO_THROTTLE, responses=tuple(responses))

    async def handle_incremental_alter_configs(self, request: Request) -> Any:
        responses = await self._alter_configs(request, apply_config_operations)
        s = response_schema(request.api_key, request.api_version)
        return s.IncrementalAlterConfigsResponse(throttle_time=NO_THROTTLE, responses=tuple(responses))

    async def _alter_configs(
        self, request: Request, compute: Callable[[Any, dict[str, str], Mapping[str, ConfigDef]], dict[str, str]]
    ) -> list[Any]:
        """Each resource is checked here (ConfigAdminManager.preprocess), then decided by the controller: at
        once on the controller's node, else in one forwarded request with the resources that passed."""
        s = response_schema(request.api_key, request.api_version)
        body = request.body
        outcomes: dict[int, Outcome] = {}
        identities = [(r.resource_type, r.resource_name) for r in body.resources]
        for index, resource in enumerate(body.resources):
            if identities.count((resource.resource_type, resource.resource_name)) > 1:
                outcomes[index] = ("INVALID_REQUEST", "Each resource must appear at most once.")
        decide = [index for index in range(len(body.resources)) if index not in outcomes]
        server = self._controller_server
        controller = server.controller if server is not None else None
        if controller is not None:
            for index in decide:
                outcomes[index] = self._decide(controller, body.resources[index], compute, body.validate_only)
            assert server is not None
            if not await server.wait_for_commit(controller):
                for index in decide:
                    outcomes[index] = ("NOT_CONTROLLER", "The controller lost its leadership before committing.")
        elif self._forwarded():
            # Another broker sent this to what it took for the active controller; it tries another.
            for index in decide:
                outcomes[index] = ("NOT_CONTROLLER", "This controller is not the active controller of the quorum.")
        elif decide:
            checked = []
            for index in decide:
                try:
                    self._check_resource(body.resources[index], compute)
                    checked.append(index)
                except ConfigRequestError as e:
                    outcomes[index] = (e.error_name, str(e))
            if checked:
                assert self._channel is not None, "a dedicated controller's requests all count as forwarded"
                forwarded = dataclasses.replace(body, resources=tuple(body.resources[i] for i in checked))
                response = await self._channel.forward(forwarded)
                for index, answer in zip(checked, response.responses, strict=True):
                    outcomes[index] = None if answer.error_code == 0 else (answer.error_code, answer.error_message)
        if not body.validate_only:
            await self._sync_metadata()
        responses = []
        for index, resource in enumerate(body.resources):
            outcome = outcomes[index]
            responses.append(
                s.AlterConfigsResourceResponse(
                    error_code=_code(outcome[0]) if outcome else error_code(None),
                    error_message=outcome[1] if outcome else None,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
            )
        return responses

    def _check_resource(
        self, resource: Any, compute: Callable[[Any, dict[str, str], Mapping[str, ConfigDef]], dict[str, str]]
    ) -> dict[str, str]:
        """The resource's new configs, once they pass the checks Kafka makes where the request arrives."""
        names = [c.name for c in resource.configs]
        if len(set(names)) != len(names):
            raise ConfigRequestError("INVALID_REQUEST", "Error due to duplicate config keys")
        nulls = [c.name for c in resource.configs if c.value is None and getattr(c, "config_operation", 0) != OP_DELETE]
        if nulls:
            raise ConfigRequestError("INVALID_REQUEST", f"Null value not supported for : {', '.join(nulls)}")
        if resource.resource_type == RESOURCE_TOPIC:
            self._authorize(AclOperation.ALTER_CONFIGS, RESOURCE_TOPIC, resource.resource_name)
            topic = self._image().topics.get(resource.resource_name)
            current = dict(topic.configs) if topic is not None else {}
            return compute(resource, current, ALL_TOPIC_CONFIGS)
        if resource.resource_type != RESOURCE_BROKER:
            raise ConfigRequestError("INVALID_REQUEST", f"Unknown resource type {resource.resource_type}")
        name = resource.resource_name
        if name and not self._forwarded():
            # A per-broker config goes to the broker it names (the admin client sends it there).
            if not name.lstrip("-").isdigit():
                raise ConfigRequestError("INVALID_REQUEST", f"Node id must be an integer, but it is: {name}")
            if int(name) != self.node_id:
                raise ConfigRequestError(
                    "INVALID_REQUEST", f"Unexpected broker id, expected {self.node_id}, but received {name}"
                )
        new_configs = compute(resource, dict(self._image().broker_configs.get(name, {})), BROKER_CONFIGS)
        try:
            self.config.validate_dynamic(new_configs, per_broker=bool(name))
        except ConfigException as e:
            # Kafka answers INVALID_REQUEST here, not INVALID_CONFIG (KAFKA-13609).
            raise ConfigRequestError("INVALID_REQUEST", str(e)) from None
        # Kafka checks a broker config where it arrives (ConfigAdminManager.preprocess), then authorizes it.
        self._authorize(AclOperation.ALTER_CONFIGS, RESOURCE_BROKER, name)
        return new_configs

    def _authorize(self, operation: AclOperation, resource_type: int, name: str) -> None:
        """Broker configs are the cluster's (CLUSTER_AUTHORIZATION_FAILED), topic configs the topic's
        (TOPIC_AUTHORIZATION_FAILED); other resource types are refused by the caller."""
        if resource_type == RESOURCE_TOPIC and not self.auth.authorize(operation, ResourceType.TOPIC, name):
            raise ConfigRequestError("TOPIC_AUTHORIZATION_FAILED", "Topic authorization failed.")
        if resource_type == RESOURCE_BROKER and not self.auth.authorize_cluster(operation):
            raise ConfigRequestError("CLUSTER_AUTHORIZATION_FAILED", "Cluster authorization failed.")

    def _forwarded(self) -> bool:
        """Whether the request came from another broker, which checked it already (on a controller listener)."""
        return listener_name() in {listener.name for listener in self.config.controller_listeners}

    def _decide(
        self,
        controller: Controller,
        resource: Any,
        compute: Callable[[Any, dict[str, str], Mapping[str, ConfigDef]], dict[str, str]],
        validate_only: bool,
    ) -> Outcome:
        try:
            new_configs = self._check_resource(resource, compute)
            if resource.resource_type == RESOURCE_TOPIC:
                if controller.topic(resource.resource_name) is None:
                    return ("UNKNOWN_TOPIC_OR_PARTITION", f"Topic '{resource.resource_name}' does not exist.")
                controller.alter_topic_configs(resource.resource_name, new_configs, validate_only=validate_only)
            else:
                controller.alter_broker_configs(resource.resource_name, new_configs, validate_only=validate_only)
        except ConfigRequestError as e:
            return (e.error_name, str(e))
        except ControllerError as e:
            return (e.error_name, str(e))
        return None


def _code(error: str | int) -> int:
    """An error name, or the code a forwarded answer already carries."""
    return error if isinstance(error, int) else error_code(error)


def _entry(s: ResponseSchema, described: Any, body: Any) -> Any:
    include_synonyms = getattr(body, "include_synonyms", False)
    include_docs = getattr(body, "include_documentation", False)
    return s.DescribeConfigsResourceResult(
        name=described.name,
        value=described.value,
        read_only=described.read_only,
        config_source=described.source,
        is_sensitive=described.sensitive,
        is_default=described.source == SOURCE_DEFAULT_CONFIG,
        synonyms=tuple(
            s.DescribeConfigsSynonym(name=synonym.name, value=synonym.value, source=synonym.source)
            for synonym in described.synonyms
        )
        if include_synonyms
        else (),
        config_type=CONFIG_TYPES.get(described.type or "", 0),
        documentation=described.doc if include_docs else None,
    )


def _replace_configs(resource: Any, _current: dict[str, str], _definitions: Mapping[str, ConfigDef]) -> dict[str, str]:
    return {c.name: c.value for c in resource.configs if c.value is not None}


def apply_config_operations(
    resource: Any, current: dict[str, str], definitions: Mapping[str, ConfigDef]
) -> dict[str, str]:
    """IncrementalAlterConfigs (Kafka's prepareIncrementalConfigs): SET, DELETE, and APPEND/SUBTRACT on list
    configs, starting from the config's default when it is not set."""
    for op in resource.configs:
        if op.config_operation == OP_SET:
            current[op.name] = op.value or ""
        elif op.config_operation == OP_DELETE:
            current.pop(op.name, None)
        elif op.config_operation in (OP_APPEND, OP_SUBTRACT):
            verb = "append" if op.config_operation == OP_APPEND else "subtract"
            definition = definitions.get(op.name)
            if definition is None:
                raise ConfigRequestError("INVALID_CONFIG", f"Unknown config name: {op.name}")
            if definition.type != "list":
                raise ConfigRequestError(
                    "INVALID_CONFIG", f"Config value {verb} is not allowed for config key: {op.name}"
                )
            base = current.get(op.name, render(definition.default))
            items = [i for i in base.split(",") if i]
            changes = [i for i in (op.value or "").split(",") if i]
            if op.config_operation == OP_APPEND:
                items += [c for c in changes if c not in items]
            else:
                items = [i for i in items if i not in changes]
            current[op.name] = ",".join(items)
        else:
            raise ConfigRequestError("INVALID_REQUEST", f"Unknown operations type {op.config_operation}")
    return current
