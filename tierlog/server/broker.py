"""The broker process: wires storage, replication, the controller and the API handlers to asyncio.

This is the only place with timers: checkpoints, retention, ISR checks, heartbeats and purgatory deadlines
are periodic calls into the core, which itself never reads the clock or sleeps.

Start-up follows Kafka's BrokerServer: (controller node: start the controller and its listener) ->
register -> catch up with the metadata log -> load the logs the image names -> wait to be unfenced ->
open the client listeners.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from tierlog.config import KafkaConfig
from tierlog.config_def import ConfigException
from tierlog.metadata.image import ClusterMetadata, ScramCredential
from tierlog.metadata.records import Endpoint
from tierlog.replication.alter_partition_manager import AlterPartitionManager
from tierlog.replication.fetcher import FetcherConfig, ReplicaFetcher
from tierlog.replication.metadata_publisher import BrokerMetadataPublisher
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.replication.replication_quota import ReplicationQuotaConfig
from tierlog.server.acl_apis import AclApis
from tierlog.server.allocator import keep_large_buffers_in_the_heap
from tierlog.server.auth_helper import AuthHelper, configured_authorizer
from tierlog.server.auto_topic_creation_manager import AutoTopicCreationManager
from tierlog.server.broker_metrics import describe_partitions, wire_broker_metrics
from tierlog.server.clock import now_ms
from tierlog.server.config_apis import ConfigApis
from tierlog.server.controller_apis import ControllerApis
from tierlog.server.controller_channel import ControllerChannel, ControllerUnavailableError, QuorumControllerChannel
from tierlog.server.controller_node import ControllerNode
from tierlog.server.controller_server import ControllerServer
from tierlog.server.fetcher_thread import FetcherThread
from tierlog.server.forwarding_manager import ForwardingManager
from tierlog.server.group_apis import GroupApis
from tierlog.server.group_coordinator import GroupCoordinatorService
from tierlog.server.http_server import HttpServer
from tierlog.server.kafka_apis import KafkaApis
from tierlog.server.lifecycle import BrokerLifecycleTask
from tierlog.server.log_cleaner_threads import LogCleanerThreads, cleaner_config
from tierlog.server.log_dir_apis import FutureLogMover, LogDirApis
from tierlog.server.meta_properties import cluster_id_on_disk, ensure_meta_properties
from tierlog.server.metadata_loader import MetadataLoaderTask
from tierlog.server.metrics import broker_metrics, metrics_route
from tierlog.server.producer_id_manager import ProducerIdManager
from tierlog.server.remote_log_metadata_topic import (
    REPLICATION_FACTOR_CONFIG as RLMM_REPLICATION_FACTOR_CONFIG,
)
from tierlog.server.remote_log_metadata_topic import TopicBasedRemoteLogMetadataManager
from tierlog.server.remote_log_tasks import RemoteLogStats, RemoteLogTasks, RemoteStorageReaderThreadPool
from tierlog.server.socket_server import SocketServer
from tierlog.server.startup import StartupError, prepare_log_dir, reason_of
from tierlog.server.trace_log import TraceLog, trace_stream_route
from tierlog.server.transaction_apis import TransactionApis
from tierlog.server.transaction_coordinator import TransactionCoordinatorService
from tierlog.storage.log_manager import LogManager
from tierlog.storage.producer_state import ProducerStateManagerConfig
from tierlog.tiered.fsspec_storage import FsspecRemoteStorageManager
from tierlog.tiered.remote_log_reader import DEFAULT_CHUNK_CACHE_BYTES, DEFAULT_PREFETCH_BYTES
from tierlog.tiered.remote_storage_manager import RemoteStorageManager

logger = logging.getLogger(__name__)

POST_ROLL_FLUSH_INTERVAL_MS = 1000
REMOTE_INDEX_CACHE_DIR = "remote-log-index-cache"


class Broker:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        # Static (not a dynamic config), and asked on every replica fetch: parsed once, not per fetch.
        self._inter_broker_listener_name = config.inter_broker_listener_name
        # The one piece of I/O here: a log directory that cannot be used stops the broker before anything
        # reads or writes any of them.
        for log_dir in (*config.log_dirs, config.metadata_log_dir):
            prepare_log_dir(log_dir)
        # Set once start() has bound its ports: only then is there anything to shut down.
        self._started = False
        self._periodic: list[asyncio.Task[None]] = []
        self._background: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._fetcher_threads: dict[int, FetcherThread] = {}
        # Fetcher tasks of leaders that changed, still winding down (kept so they are not garbage-collected).
        self._stopping_fetchers: set[asyncio.Task[None]] = set()
        self._alter_partition_wakeup = asyncio.Event()
        self.controller_server: ControllerServer | None = None
        self.http_server: HttpServer | None = None
        self.socket_server = SocketServer(config, (*config.controller_listeners, *config.listeners))
        self.inter_broker_security = config.inter_broker_client_security()
        self.trace_log = TraceLog(config.node_id)
        # Everything is built here, without I/O, so stop() can clean up after a start that failed half-way.
        self.log_manager = LogManager(
            config.log_dirs,
            config.broker_log_defaults(),
            config.remote_storage_system_enable,
            ProducerStateManagerConfig(config.get_int("producer.id.expiration.ms")),
        )
        # Kafka's StandardAuthorizer when authorizer.class.name names it, kept in step with the metadata image;
        # every API asks it through `auth` (docs/security.md#api-checks).
        self.authorizer = configured_authorizer(config)
        auth = AuthHelper(self.authorizer, [listener.name for listener in config.controller_listeners])
        controller_apis: ControllerApis | None = None
        if config.is_controller:
            self.controller_server = ControllerServer(config)
            controller_apis = ControllerApis(config, self.controller_server, auth)
        self.channel: ControllerChannel = QuorumControllerChannel(
            config.controller_quorum_servers,
            local=self.controller_server,
            client_id=f"broker-{config.node_id}-controller",
            request_timeout_ms=config.get_int("replica.socket.timeout.ms"),
            quorum_request_timeout_ms=config.get_int("controller.quorum.request.timeout.ms"),
            retry_backoff_ms=config.get_int("controller.quorum.retry.backoff.ms"),
            security=config.controller_client_security(),
        )
        self.loader = MetadataLoaderTask(config.node_id, self.channel, self._publish)
        self.lifecycle = BrokerLifecycleTask(
            config.node_id,
            self._advertised_endpoints(),
            None,
            self.channel,
            self.loader,
            config.get_int("broker.heartbeat.interval.ms"),
            cluster_id_on_disk(config.log_dirs),
        )
        self.forwarding_manager = ForwardingManager(config.node_id, self.channel, self.loader, controller_apis)
        self.auto_topic_creation = AutoTopicCreationManager(config, lambda: self.loader.image, self.forwarding_manager)
        # The remote tier (remote.log.storage.system.enable): its storage, its metadata and its reader threads
        # come first, as the ReplicaManager reads the tier through them; the RemoteLogManager's tasks, which
        # run over the ReplicaManager's replicas, come after it.
        self.rlmm: TopicBasedRemoteLogMetadataManager | None = None
        self.remote_storage_readers: RemoteStorageReaderThreadPool | None = None
        self.remote_log: RemoteLogTasks | None = None
        rsm: RemoteStorageManager | None = None
        remote_log_stats = RemoteLogStats()
        if config.remote_storage_system_enable:
            rsm = self._remote_storage_manager()
            self.rlmm = self._remote_log_metadata_manager()
            self.remote_storage_readers = RemoteStorageReaderThreadPool(
                self.rlmm.store,
                rsm,
                remote_log_stats,
                self.log_manager.get_log,
                index_cache_dir=config.log_dirs[0] / REMOTE_INDEX_CACHE_DIR,
                index_cache_bytes=config.get_int("remote.log.index.file.cache.total.size.bytes"),
                reader_threads=config.get_int("remote.log.reader.threads"),
                **self._chunk_cache_settings(),
            )
        self.replica_manager = ReplicaManager(
            config.node_id,
            self.log_manager,
            replica_lag_time_max_ms=config.get_int("replica.lag.time.max.ms"),
            fetcher_config=FetcherConfig(
                replica_id=config.node_id,
                max_wait_ms=config.get_int("replica.fetch.wait.max.ms"),
                min_bytes=config.get_int("replica.fetch.min.bytes"),
                max_bytes=config.get_int("replica.fetch.response.max.bytes"),
                partition_max_bytes=config.get_int("replica.fetch.max.bytes"),
                backoff_ms=config.get_int("replica.fetch.backoff.ms"),
            ),
            trace=self.trace_log.record,
            remote_read=self.remote_storage_readers.async_read if self.remote_storage_readers is not None else None,
            remote_fetch_max_wait_ms=config.get_int("remote.fetch.max.wait.ms"),
            replication_quota_config=ReplicationQuotaConfig(
                window_num=config.get_int("replication.quota.window.num"),
                window_size_seconds=config.get_int("replication.quota.window.size.seconds"),
            ),
        )
        self._update_replication_quotas()
        self.metadata_publisher = BrokerMetadataPublisher(self.replica_manager)
        # Moves between log dirs (AlterReplicaLogDirs) copy as a follower fetches: replica.fetch.max.bytes a step.
        self.future_log_mover = FutureLogMover(
            self.replica_manager, config.get_int("replica.fetch.max.bytes"), config.get_int("replica.fetch.backoff.ms")
        )
        self.alter_partition_manager = AlterPartitionManager(config.node_id, self.replica_manager)
        if self.rlmm is not None and rsm is not None and self.remote_storage_readers is not None:
            self.remote_log = RemoteLogTasks(
                config.node_id,
                self.replica_manager,
                self.rlmm,
                rsm,
                self.remote_storage_readers,
                remote_log_stats,
                task_interval_ms=config.get_int("remote.log.manager.task.interval.ms"),
                copier_threads=config.get_int("remote.log.manager.copier.thread.pool.size"),
            )
        self._metrics_registry = CollectorRegistry()
        self.metrics = broker_metrics(self._metrics_registry)
        wire_broker_metrics(self.metrics, self.replica_manager, self.remote_log)
        self.log_cleaner = LogCleanerThreads(config, self.log_manager, self._metrics_registry)
        self.group_coordinator = GroupCoordinatorService(
            config,
            self.replica_manager,
            lambda: self.loader.image,
            self.auto_topic_creation.create_topic,
            self._arm_purgatory_timer,
            self._metrics_registry,
        )
        # One source of producer ids for idempotent and transactional producers (docs/transactions.md#producer-ids).
        self.producer_ids = ProducerIdManager(
            lambda: self.channel.allocate_producer_ids(config.node_id, self.lifecycle.broker_epoch)
        )
        self.transaction_coordinator = TransactionCoordinatorService(
            config,
            self.replica_manager,
            lambda: self.loader.image,
            self.auto_topic_creation.create_topic,
            self._arm_purgatory_timer,
            self.producer_ids,
            self.inter_broker_security,
            # The markers of partitions this broker leads go straight to its WriteTxnMarkers appends.
            lambda markers: self.apis.txn_marker_apis.write_markers(markers),
        )
        group_apis = GroupApis(config, self.group_coordinator, lambda: self.loader.image, auth)
        transaction_apis = TransactionApis(
            config,
            self.transaction_coordinator,
            self.producer_ids,
            lambda: self.loader.image,
            self.group_coordinator.coordinator.partition_for,
            group_apis.handle_find_coordinator,
            auth,
        )
        self.apis = KafkaApis(
            config,
            self.loader,
            self.replica_manager,
            self._arm_purgatory_timer,
            self.channel,
            forwarding_manager=self.forwarding_manager,
            auto_topic_creation=self.auto_topic_creation,
            group_apis=group_apis,
            transaction_apis=transaction_apis,
            offsets_transaction_completed=self.group_coordinator.complete_transaction,
            config_apis=ConfigApis(
                config,
                lambda: self.loader.image,
                self.controller_server,
                self.channel,
                self.forwarding_manager.sync_metadata,
                auth,
            ),
            log_dir_apis=LogDirApis(self.replica_manager, auth, self.future_log_mover),
            acl_apis=AclApis(self.authorizer, auth, self.forwarding_manager.forward),
            controller_apis=controller_apis,
            remote_log=self.remote_log,
            auth=auth,
            metrics=self.metrics,
            after_request=self._after_request,
        )

    def _remote_storage_manager(self) -> RemoteStorageManager:
        """KIP-405's default RemoteStorageManager (fsspec), configured through Kafka's impl prefix (rsm.config.*)."""
        try:
            return FsspecRemoteStorageManager.from_config(
                self.config.prefixed("remote.log.storage.manager.impl.prefix")
            )
        except ValueError as e:
            raise ConfigException(str(e)) from None

    def _chunk_cache_settings(self) -> dict[str, int]:
        """The remote reads' chunk cache (docs/performance.md#remote-reads), named as the RSM settings of Kafka's
        tiered-storage plugins: rsm.config.fetch.chunk.cache.size and rsm.config.fetch.chunk.cache.prefetch.max.size
        (bytes, both >= 0)."""
        rsm_settings = self.config.prefixed("remote.log.storage.manager.impl.prefix")
        prefix = self.config.get("remote.log.storage.manager.impl.prefix")
        settings = {}
        for name, argument, default in (
            ("fetch.chunk.cache.size", "chunk_cache_bytes", DEFAULT_CHUNK_CACHE_BYTES),
            ("fetch.chunk.cache.prefetch.max.size", "prefetch_bytes", DEFAULT_PREFETCH_BYTES),
        ):
            text = rsm_settings.get(name, str(default)).strip()
            if not text.isdigit():
                raise ConfigException(f"Invalid value {text} for configuration {prefix}{name}: not a number of bytes")
            settings[argument] = int(text)
        return settings

    def _remote_log_metadata_manager(self) -> TopicBasedRemoteLogMetadataManager:
        """KIP-405's topic-based RemoteLogMetadataManager, configured through Kafka's impl prefix (rlmm.config.*)."""
        config = self.config
        rlmm_settings = config.prefixed("remote.log.metadata.manager.impl.prefix")
        rlmm_settings[RLMM_REPLICATION_FACTOR_CONFIG] = str(
            config.internal_topic_replication_factor(RLMM_REPLICATION_FACTOR_CONFIG, rlmm_settings)
        )
        return TopicBasedRemoteLogMetadataManager(
            config.node_id,
            rlmm_settings,
            lambda: self.loader.image,
            self._leader_endpoint,
            self.auto_topic_creation.create_topic,
            request_timeout_ms=config.get_int("replica.socket.timeout.ms"),
            security=self.inter_broker_security,
        )

    async def start(self) -> None:
        """Start-up fails before it writes anything when a port cannot be bound (log directories were checked
        when the broker was built), so a broker that cannot run leaves no cluster id behind and prints nothing
        that looks like a start (docs/configuration.md)."""
        config = self.config
        # Every port is bound now, as Kafka's SocketServer binds its acceptors when it is built; each serves
        # once its side is ready (the controller's at once, the clients' once the broker is unfenced).
        controller_servers = [
            await self.socket_server.bind(listener, self.apis, self._controller_scram_credential)
            for listener in config.controller_listeners
        ]
        client_servers = [
            await self.socket_server.bind(listener, self.apis, self._scram_credential) for listener in config.listeners
        ]
        await self._start_http(self._metrics_registry)
        self._started = True
        if self.controller_server is not None:
            await self.controller_server.start()
            # Other brokers register through this listener before this node's broker side is ready.
            for server in controller_servers:
                await server.start_serving()
        self._background.append(asyncio.create_task(self.loader.run(), name="metadata-loader"))
        self._background.append(asyncio.create_task(self.lifecycle.run(), name="broker-lifecycle"))
        self._background.append(asyncio.create_task(self._send_alter_partitions(), name="alter-partition"))
        self._background.append(asyncio.create_task(self.future_log_mover.run(), name="replica-alter-log-dirs"))
        await self.lifecycle.unfenced.wait()
        for server in client_servers:
            await server.start_serving()
        if self.rlmm is not None and self.remote_log is not None:
            self.rlmm.start()
            self.remote_log.start()
        self._every_off_loop(
            "replica.high.watermark.checkpoint.interval.ms", self.log_manager.high_watermark_checkpoint
        )
        self._every("log.flush.offset.checkpoint.interval.ms", self.log_manager.checkpoint_recovery_points)
        self._every_off_loop(
            "log.flush.start.offset.checkpoint.interval.ms", self.log_manager.log_start_offset_checkpoint
        )
        self._every("log.retention.check.interval.ms", lambda: self.log_manager.cleanup_logs(now_ms()))
        self._every("offsets.retention.check.interval.ms", self.group_coordinator.cleanup_group_metadata)
        self._every(
            "producer.id.expiration.check.interval.ms", lambda: self.log_manager.remove_expired_producers(now_ms())
        )
        # Kafka flushes a rolled segment right after the roll (on its scheduler), which advances the recovery
        # point; flush.ms / flush.messages, checked here too, are off by default, as in Kafka.
        self._every_ms("flush-log", POST_ROLL_FLUSH_INTERVAL_MS, lambda: self.log_manager.flush_dirty_logs(now_ms()))
        # Kafka's isr-expiration task runs every replica.lag.time.max.ms / 2.
        self._every_ms("isr-expiration", max(1, config.get_int("replica.lag.time.max.ms") // 2), self._shrink_isrs)
        self.log_cleaner.start()
        advertised = config.advertised_listener
        logger.info(
            "[Broker id=%d] started, serving %s:%d, cluster id %s, log dirs %s",
            config.node_id,
            advertised.host,
            advertised.port,
            self.loader.image.cluster_id,
            ", ".join(map(str, config.log_dirs)),
        )

    def _advertised_endpoints(self) -> list[Endpoint]:
        return [Endpoint(listener.name, listener.host, listener.port) for listener in self.config.advertised_listeners]

    async def _start_http(self, registry: CollectorRegistry) -> None:
        address = self.config.http_listener
        if address is None:
            return
        host, port = address

        async def partitions(_request: web.Request) -> web.Response:
            return web.json_response(
                {
                    "broker_id": self.config.node_id,
                    "partitions": describe_partitions(self.replica_manager, self.remote_log),
                }
            )

        self.http_server = HttpServer(
            [metrics_route(registry), web.get("/v1/partitions", partitions), trace_stream_route(self.trace_log)]
        )
        try:
            bound = await self.http_server.start(host, port)
        except OSError as e:
            raise StartupError(f"cannot listen on tierlog.http.listener {host}:{port}: {reason_of(e)}") from None
        logger.info("[Broker id=%d] HTTP (metrics, partitions, trace) on %s:%d", self.config.node_id, host, bound)

    # Metadata

    def _publish(self, image: ClusterMetadata) -> None:
        if self.authorizer is not None:
            self.authorizer.sync(image.acls)
        self._apply_dynamic_configs(image)
        if not self.metadata_publisher.logs_loaded:
            for log_dir in self.config.log_dirs:
                ensure_meta_properties(log_dir, self.config.node_id, image.cluster_id)
        self.metadata_publisher.publish(image, now_ms())
        self._reconcile_fetchers()
        self.group_coordinator.on_metadata(image)
        self.transaction_coordinator.on_metadata(image)
        self._after_request()

    def _apply_dynamic_configs(self, image: ClusterMetadata) -> None:
        """Kafka's DynamicBrokerConfig: the dynamic broker configs the metadata now holds for this broker take
        effect at once (docs/configuration.md). A set that does not make a valid configuration with this
        broker's own settings is logged and left out, and the broker keeps its current one."""
        config = self.config
        layers = image.dynamic_broker_configs(config.node_id)
        if layers == (config.dynamic_defaults, config.dynamic_broker):
            return
        try:
            changed = config.reconfigure(*layers)
        except ConfigException as e:
            logger.error("[Broker id=%d] dynamic broker configs not applied: %s", config.node_id, e)
            return
        if not changed:
            return
        logger.info(
            "[Broker id=%d] dynamic broker configs now in effect: %s", config.node_id, ", ".join(sorted(changed))
        )
        self.log_manager.reconfigure(
            config.broker_log_defaults(),
            ProducerStateManagerConfig(config.get_int("producer.id.expiration.ms")),
            {name: topic.configs for name, topic in image.topics.items()},
        )
        self.replica_manager.remote_fetch_max_wait_ms = config.get_int("remote.fetch.max.wait.ms")
        self._update_replication_quotas()
        if any(name.startswith("log.cleaner.") for name in changed):
            self._background.append(
                asyncio.create_task(
                    self.log_cleaner.reconfigure(cleaner_config(config)), name="log-cleaner-reconfigure"
                )
            )

    def _update_replication_quotas(self) -> None:
        """The rates of the replication throttles (docs/replication.md#throttles), dynamic broker configs."""
        self.replica_manager.leader_quota.update_quota(self.config.get_int("leader.replication.throttled.rate"))
        self.replica_manager.follower_quota.update_quota(self.config.get_int("follower.replication.throttled.rate"))

    def _reconcile_fetchers(self) -> None:
        wanted: dict[int, ReplicaFetcher] = dict(self.replica_manager.fetchers)
        for leader_id, thread in list(self._fetcher_threads.items()):
            if wanted.get(leader_id) is not thread.fetcher:
                del self._fetcher_threads[leader_id]
                self._stopping_fetchers.add(task := asyncio.create_task(thread.stop()))
                task.add_done_callback(self._stopping_fetchers.discard)
        for leader_id, fetcher in wanted.items():
            thread = self._fetcher_threads.get(leader_id)
            if thread is None:
                thread = FetcherThread(
                    fetcher,
                    self._leader_endpoint,
                    client_id=f"broker-{self.config.node_id}-fetcher-{leader_id}",
                    request_timeout_ms=self.config.get_int("replica.socket.timeout.ms"),
                    remote_log_aux_state=self.remote_log.remote_log_aux_state if self.remote_log else None,
                    security=self.inter_broker_security,
                )
                self._fetcher_threads[leader_id] = thread
                thread.start()
            thread.wakeup.set()

    def _leader_endpoint(self, broker_id: int) -> Endpoint | None:
        return self.loader.image.endpoint_of(broker_id, self._inter_broker_listener_name)

    # ISR changes (AlterPartition)

    def _after_request(self) -> None:
        """Something may have queued an ISR change: let the sender look."""
        self._alter_partition_wakeup.set()

    def _shrink_isrs(self) -> None:
        self.replica_manager.maybe_shrink_isr(now_ms())
        self._after_request()

    async def _send_alter_partitions(self) -> None:
        """Carry the AlterPartitionManager's requests to the controller and the answers back; with none to
        send, wait until a request or a timer may have proposed an ISR change."""
        manager = self.alter_partition_manager
        while True:
            request = manager.poll(self.lifecycle.broker_epoch)
            if request is None:
                await self._alter_partition_wakeup.wait()
                self._alter_partition_wakeup.clear()
                continue
            try:
                answers = await self.channel.alter_partition(request.broker_id, request.broker_epoch, request.proposals)
            except ControllerUnavailableError as e:
                manager.on_request_failed(str(e), now_ms())
            else:
                manager.on_response(answers, now_ms())

    # Connections and timers

    def _scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.loader.image.scram_credentials.get((user, mechanism))

    def _controller_scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """The controller's own listener reads the controller's metadata (the active controller's, else this
        voter's committed log's), which has every SCRAM user before this node's broker side has caught up (brokers
        register through it first)."""
        assert self.controller_server is not None  # only a controller node has controller listeners
        return self.controller_server.security_image.scram_credentials.get((user, mechanism))

    @property
    def bound_ports(self) -> list[int]:
        return self.socket_server.bound_ports

    def _every(self, interval_config: str, action: Callable[[], object]) -> None:
        self._every_ms(interval_config, self.config.get_int(interval_config), action)

    def _every_off_loop(self, interval_config: str, snapshot: Callable[[], Callable[[], None]]) -> None:
        """A checkpoint taken on the event loop (`snapshot`) and written (fsynced) in a thread, as Kafka's scheduler
        thread writes it: an fsync on the loop would hold up every request of the broker, and an acks=all produce
        waits for three brokers (docs/performance.md#replication)."""

        async def write() -> None:
            await asyncio.to_thread(snapshot())

        self._every(interval_config, write)

    def _every_ms(self, name: str, interval_ms: int, action: Callable[[], object]) -> None:
        if interval_ms >= 2**53:
            return  # Kafka's Long.MAX_VALUE means never.

        async def repeat() -> None:
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    done = action()
                    if inspect.isawaitable(done):
                        await done
                except Exception:
                    logger.exception("periodic task %s failed", name)

        self._periodic.append(asyncio.create_task(repeat(), name=name))

    def _arm_purgatory_timer(self, deadline_ms: int) -> None:
        loop = asyncio.get_running_loop()
        delay = max(0.0, (deadline_ms - now_ms()) / 1000)
        loop.call_later(delay, self._expire_delayed_operations)

    def _expire_delayed_operations(self, now: int | None = None) -> None:
        now = now_ms() if now is None else now
        self.replica_manager.fetch_purgatory.expire(now)
        self.replica_manager.produce_purgatory.expire(now)
        self.replica_manager.remote_fetch_purgatory.expire(now)

    async def serve_until_stopped(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        """Controlled shutdown: hand leaderships to other replicas, stop accepting, end connections, then
        flush and checkpoint everything and leave the clean-shutdown marker so the next start skips recovery."""
        if not self._started:
            self.socket_server.stop_accepting()
            await self.channel.close()
            return
        await self.lifecycle.controlled_shutdown()
        self.socket_server.stop_accepting()
        for task in self._periodic + self._background:
            task.cancel()
        await asyncio.gather(*self._periodic, *self._background, return_exceptions=True)
        await self.log_cleaner.stop()
        await asyncio.gather(
            *(thread.stop() for thread in self._fetcher_threads.values()),
            *self._stopping_fetchers,
            return_exceptions=True,
        )
        self._fetcher_threads.clear()
        if self.remote_log is not None:
            await self.remote_log.stop()
        if self.remote_storage_readers is not None:
            await self.remote_storage_readers.stop()
        if self.rlmm is not None:
            await self.rlmm.stop()
        if self.http_server is not None:
            await self.http_server.stop()
        self.group_coordinator.stop()
        await self.transaction_coordinator.stop()
        self.producer_ids.stop()
        # Answer every parked request now, then end each connection.
        self._expire_delayed_operations(2**63 - 1)
        await asyncio.sleep(0)
        await self.socket_server.close_connections()
        await self.channel.close()
        if self.metadata_publisher.logs_loaded:
            self.log_manager.shutdown()
        if self.controller_server is not None:
            await self.controller_server.stop()
        logger.info("[Broker id=%d] shut down cleanly", self.config.node_id)


async def _run(config: KafkaConfig) -> None:
    config.log_unused()
    node = ControllerNode(config) if config.is_dedicated_controller else Broker(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.request_stop)
    starting = asyncio.create_task(node.start())
    stopped = asyncio.create_task(node.serve_until_stopped())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            await stopped
        else:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
    finally:
        stopped.cancel()
        await node.stop()


def run_node(config: KafkaConfig) -> None:
    """Run the node `config` describes (a broker, combined with the controller or not, or a dedicated controller:
    process.roles) in this process until SIGTERM or SIGINT."""
    keep_large_buffers_in_the_heap()
    asyncio.run(_run(config))
