"""A dedicated controller (process.roles=controller): the controller and its listeners, without a broker.

Kafka runs such a node as its ControllerServer alone: it listens on its controller listeners only and keeps
the metadata log; it has no client listener, no partitions, no group coordinator and does not register as a
broker. tierlog's `ControllerNode` is that: the same `ControllerServer` and `ControllerApis` a combined node
(process.roles=broker,controller, server/broker.py) runs, served by `ControllerNodeApis` on a `SocketServer`.
The rules: docs/configuration.md#dedicated-controllers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tierlog.config import KafkaConfig
from tierlog.metadata.image import ScramCredential
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.security.authorizer import StandardAuthorizer
from tierlog.server.acl_apis import AclApis
from tierlog.server.admin_authorization import CHECKED_ADMIN_APIS, forward_authorized
from tierlog.server.auth_helper import AuthHelper, configured_authorizer
from tierlog.server.config_apis import ConfigApis
from tierlog.server.controller_apis import ADMIN_APIS, BROKER_TO_CONTROLLER_APIS, ControllerApis
from tierlog.server.controller_server import ControllerServer
from tierlog.server.entities import NO_THROTTLE, response_schema
from tierlog.server.kafka_apis import (
    API_API_VERSIONS,
    API_FETCH,
    API_SASL_AUTHENTICATE,
    API_SASL_HANDSHAKE,
    Handler,
    api_versions_response,
    handle_sasl_authenticate,
    handle_sasl_handshake,
)
from tierlog.server.meta_properties import ensure_meta_properties
from tierlog.server.socket_server import SocketServer
from tierlog.server.startup import prepare_log_dir

logger = logging.getLogger(__name__)


class ControllerNodeApis:
    """What a dedicated controller answers on its controller listeners: the controller's APIs (ControllerApis:
    brokers' registrations, heartbeats, AlterPartition, producer ids, and the admin requests brokers forward),
    the config APIs (config changes brokers forward, decided by the active controller; described from the
    committed metadata), the Fetch of the metadata log, the ACL APIs, ApiVersions, and ILLEGAL_SASL_STATE for a
    SASL request after authentication. The forwarded admin requests are checked as a combined node's controller
    listener checks them (the peer needs CLUSTER_ACTION: docs/security.md#api-checks)."""

    def __init__(
        self,
        server: ControllerServer,
        controller_apis: ControllerApis,
        config_apis: ConfigApis,
        authorizer: StandardAuthorizer | None,
        auth: AuthHelper,
    ) -> None:
        self._server = server
        self._controller_apis = controller_apis
        self._authorizer = authorizer
        self._auth = auth
        self.handlers: dict[int, Handler] = {
            API_API_VERSIONS: self.handle_api_versions,
            API_SASL_HANDSHAKE: handle_sasl_handshake,
            API_SASL_AUTHENTICATE: handle_sasl_authenticate,
            API_FETCH: self.handle_fetch,
        }
        # The controller's decisions are answered once committed (ControllerApis.handle), the voters' requests and
        # DescribeQuorum by the Raft core at once.
        self.handlers.update(dict.fromkeys(BROKER_TO_CONTROLLER_APIS, controller_apis.handle))
        self.handlers.update(dict.fromkeys(ADMIN_APIS, controller_apis.handle))
        self.handlers.update(controller_apis.quorum_handlers)
        self.handlers.update(dict.fromkeys(CHECKED_ADMIN_APIS & set(ADMIN_APIS), self.handle_admin))
        self.handlers.update(AclApis(authorizer, auth, controller_apis.handle).handlers)
        self.handlers.update(config_apis.handlers)

    async def handle(self, request: Request) -> Any:
        if self._authorizer is not None:
            # The ACLs are the metadata's: the active controller's, or this node's committed log's while another
            # controller is active. Take on what the last change made before checking.
            self._authorizer.sync(self._server.security_image.acls)
        return await self.handlers[request.api_key](request)

    async def handle_api_versions(self, request: Request) -> Any:
        return api_versions_response(request, self.handlers.keys())

    async def handle_admin(self, request: Request) -> Any:
        controller = self._server.controller
        if controller is None:
            return await self._controller_apis.handle(request)  # NOT_CONTROLLER, before any check
        return await forward_authorized(self._auth, controller.metadata, request, self._controller_apis.handle)

    async def handle_fetch(self, request: Request) -> Any:
        """The metadata log is the only partition a controller has: a Fetch of anything else is refused whole
        (INVALID_REQUEST, as Kafka's KafkaRaftClient answers a Fetch of another partition)."""
        if self._controller_apis.is_metadata_fetch(request):
            return await self._controller_apis.handle_metadata_fetch(request)
        s = response_schema(request.api_key, request.api_version)
        return s.FetchResponse(
            throttle_time=NO_THROTTLE, error_code=error_code("INVALID_REQUEST"), session_id=0, responses=()
        )


class ControllerNode:
    """The process of a `process.roles=controller` node; started, stopped and signalled as a `Broker` is."""

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        # meta.properties goes into every directory the node was given, as Kafka formats them all.
        self._log_dirs = list(dict.fromkeys((config.metadata_log_dir, *config.log_dirs)))
        for log_dir in self._log_dirs:
            prepare_log_dir(log_dir)
        self._started = False
        self._cluster_id: str | None = None
        self._stopped = asyncio.Event()
        self.authorizer = configured_authorizer(config)
        auth = AuthHelper(self.authorizer, [listener.name for listener in config.controller_listeners])
        self.controller_server = ControllerServer(config)
        controller_apis = ControllerApis(config, self.controller_server, auth)
        server = self.controller_server
        config_apis = ConfigApis(config, lambda: server.security_image, server, None, _nothing_to_sync, auth)
        self.apis = ControllerNodeApis(server, controller_apis, config_apis, self.authorizer, auth)
        self.socket_server = SocketServer(config, config.controller_listeners)

    async def start(self) -> None:
        """Bind every controller listener first (a port in use stops the start before anything is written), then
        open the metadata log and serve."""
        config = self.config
        servers = [
            await self.socket_server.bind(listener, self.apis, self._scram_credential)
            for listener in config.controller_listeners
        ]
        self._started = True
        await self.controller_server.start()
        self.controller_server.raft.add_listener(self._write_meta_properties)
        self._write_meta_properties()
        for server in servers:
            await server.start_serving()
        logger.info(
            "[ControllerNode id=%d] started, serving %s, metadata log dir %s",
            config.node_id,
            ", ".join(f"{listener.name}://{listener.host}:{listener.port}" for listener in config.controller_listeners),
            config.metadata_log_dir,
        )

    def _write_meta_properties(self) -> None:
        """meta.properties, once this node knows the cluster id (its metadata holds the ClusterIdRecord)."""
        cluster_id = self.controller_server.security_image.cluster_id
        if self._cluster_id is not None or not cluster_id:
            return
        self._cluster_id = cluster_id
        for log_dir in self._log_dirs:
            ensure_meta_properties(log_dir, self.config.node_id, self._cluster_id)

    def _scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.controller_server.security_image.scram_credentials.get((user, mechanism))

    @property
    def bound_ports(self) -> list[int]:
        return self.socket_server.bound_ports

    async def serve_until_stopped(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        """Stop accepting, end the connections, then stop the controller (a parked metadata fetch is answered)
        and close the metadata log."""
        self.socket_server.stop_accepting()
        if not self._started:
            return
        await self.socket_server.close_connections()
        await self.controller_server.stop()
        logger.info("[ControllerNode id=%d] shut down cleanly", self.config.node_id)


async def _nothing_to_sync() -> None:
    """A controller's image is the committed metadata itself: a config change has no broker image to wait for."""
