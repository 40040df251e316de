"""The broker process: wires storage, replication, the controller and the API handlers to asyncio.

This is the only place with timers: checkpoints, retention and purgatory deadlines are periodic calls into
the core, which itself never reads the clock or sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable

from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller
from tierlog.controller.metadata import FileMetadataStore
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.server.connection import serve_connection
from tierlog.server.kafka_apis import KafkaApis, now_ms
from tierlog.server.meta_properties import ensure_meta_properties
from tierlog.storage.log_manager import LogManager

logger = logging.getLogger(__name__)

POST_ROLL_FLUSH_INTERVAL_MS = 1000
SHUTDOWN_DRAIN_S = 5.0


class Broker:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._periodic: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        config = self.config
        for log_dir in config.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
        first_dir = config.log_dirs[0]
        self.controller = Controller(FileMetadataStore(first_dir), lambda: [config.node_id])
        cluster_id = self.controller.metadata.cluster_id
        for log_dir in config.log_dirs:
            ensure_meta_properties(log_dir, config.node_id, cluster_id)
        self.log_manager = LogManager(config.log_dirs, config.broker_log_defaults())
        topics = self.controller.metadata.topics
        self.log_manager.startup({name: topic.configs for name, topic in topics.items()}, now_ms())
        self.replica_manager = ReplicaManager(config.node_id, self.log_manager)
        self.replica_manager.apply_metadata(self.controller.metadata, now_ms())
        self.apis = KafkaApis(config, self.controller, self.replica_manager, self._arm_purgatory_timer)
        max_request = config.get_int("socket.request.max.bytes")
        for listener in config.listeners:
            server = await asyncio.start_server(
                lambda r, w: self._accept(r, w, max_request),
                listener.host or None,
                listener.port,
                reuse_address=True,
                limit=2**20,
            )
            self._servers.append(server)
        self._every("replica.high.watermark.checkpoint.interval.ms", self.log_manager.checkpoint_high_watermarks)
        self._every("log.flush.offset.checkpoint.interval.ms", self.log_manager.checkpoint_recovery_points)
        self._every("log.flush.start.offset.checkpoint.interval.ms", self.log_manager.checkpoint_log_start_offsets)
        self._every("log.retention.check.interval.ms", lambda: self.log_manager.cleanup_logs(now_ms()))
        # Kafka flushes a rolled segment right after the roll (on its scheduler), which advances the recovery
        # point; flush.ms / flush.messages, checked here too, are off by default, as in Kafka.
        self._every_ms("flush-log", POST_ROLL_FLUSH_INTERVAL_MS, lambda: self.log_manager.flush_dirty_logs(now_ms()))
        advertised = config.advertised_listener
        logger.info(
            "[Broker id=%d] started, serving %s:%d, cluster id %s, log dirs %s",
            config.node_id,
            advertised.host,
            advertised.port,
            cluster_id,
            ", ".join(map(str, config.log_dirs)),
        )

    @property
    def bound_ports(self) -> list[int]:
        return [sock.getsockname()[1] for server in self._servers for sock in server.sockets]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_request: int) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            await serve_connection(reader, writer, self.apis, max_request)
        finally:
            del self._connections[task]

    def _every(self, interval_config: str, action: Callable[[], object]) -> None:
        self._every_ms(interval_config, self.config.get_int(interval_config), action)

    def _every_ms(self, name: str, interval_ms: int, action: Callable[[], object]) -> None:
        if interval_ms >= 2**53:
            return  # Kafka's Long.MAX_VALUE means never.

        async def repeat() -> None:
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    action()
                except Exception:
                    logger.exception("periodic task %s failed", name)

        self._periodic.append(asyncio.create_task(repeat(), name=name))

    def _arm_purgatory_timer(self, deadline_ms: int) -> None:
        loop = asyncio.get_running_loop()
        delay = max(0.0, (deadline_ms - now_ms()) / 1000)
        loop.call_later(delay, self._expire_delayed_operations)

    def _expire_delayed_operations(self) -> None:
        self.replica_manager.fetch_purgatory.expire(now_ms())

    async def serve_until_stopped(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        """Controlled shutdown: stop accepting, end connections, then flush and checkpoint everything and
        leave the clean-shutdown marker so the next start skips recovery."""
        for server in self._servers:
            server.close()
        for task in self._periodic:
            task.cancel()
        await asyncio.gather(*self._periodic, return_exceptions=True)
        # Answer every parked fetch now, then end each connection by closing its socket: the connection's
        # loop sees the end of its stream and returns, with no half-written response and no cancellation.
        self.replica_manager.fetch_purgatory.expire(2**63 - 1)
        await asyncio.sleep(0)
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            _, lingering = await asyncio.wait(list(self._connections), timeout=SHUTDOWN_DRAIN_S)
            for task in lingering:
                task.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self.log_manager.shutdown()
        logger.info("[Broker id=%d] shut down cleanly", self.config.node_id)


async def _run(config: KafkaConfig) -> None:
    broker = Broker(config)
    await broker.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, broker.request_stop)
    try:
        await broker.serve_until_stopped()
    finally:
        await broker.stop()


def run_broker(config: KafkaConfig) -> None:
    """Run a broker in this process until SIGTERM or SIGINT."""
    asyncio.run(_run(config))
