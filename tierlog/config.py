"""Broker configuration: a `server.properties` file with Kafka's names and defaults.

Every setting has an embedded default so `tierlog broker` alone starts a working broker on 127.0.0.1:9092.
Topic-level defaults (`log.segment.bytes`, `log.retention.ms`, ...) are read through `broker_log_defaults`
by `tierlog.storage.log_config`, which owns the topic config table. Unknown names are kept (Kafka warns
about them and carries on), so a real Kafka `server.properties` starts a tierlog broker unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerConfigDef:
    name: str
    default: str
    type: str  # Kafka's ConfigDef type names: int, long, string, boolean, list, double
    doc: str


def _d(name: str, default: str, type_: str, doc: str) -> BrokerConfigDef:
    return BrokerConfigDef(name, default, type_, doc)


BROKER_CONFIGS: dict[str, BrokerConfigDef] = {
    d.name: d
    for d in (
        _d("node.id", "1", "int", "The node id of this server."),
        _d("process.roles", "broker,controller", "list", "The roles this node plays."),
        _d("listeners", "PLAINTEXT://127.0.0.1:9092", "list", "Listener URIs the broker binds."),
        _d("advertised.listeners", "", "list", "Listeners given to clients; defaults to listeners."),
        _d("log.dirs", "/tmp/tierlog-logs", "list", "Directories where partition data is kept."),
        _d("num.partitions", "1", "int", "Default partition count of auto-created topics."),
        _d("default.replication.factor", "1", "int", "Default replication factor of new topics."),
        _d("auto.create.topics.enable", "true", "boolean", "Create unknown topics on metadata request."),
        _d("delete.topic.enable", "true", "boolean", "Allow DeleteTopics."),
        _d("socket.request.max.bytes", "104857600", "int", "Largest request frame accepted."),
        _d("message.max.bytes", "1048588", "int", "Largest record batch accepted (max.message.bytes)."),
        _d("fetch.max.bytes", "57671680", "int", "Upper bound of bytes in one fetch response."),
        _d("min.insync.replicas", "1", "int", "ISR size needed for acks=all."),
        _d("log.retention.check.interval.ms", "300000", "long", "How often retention runs."),
        # The log cleaner (compaction of cleanup.policy=compact topics); the last four are the brokers'
        # defaults of the topic configs min.cleanable.dirty.ratio, min/max.compaction.lag.ms, delete.retention.ms.
        _d("log.cleaner.enable", "true", "boolean", "Run the log cleaner, which compacts compacted topics."),
        _d("log.cleaner.threads", "1", "int", "Logs cleaned at the same time; they share the dedupe buffer."),
        _d("log.cleaner.backoff.ms", "15000", "long", "Pause of the cleaner when no log needs cleaning."),
        _d("log.cleaner.dedupe.buffer.size", "134217728", "long", "Memory of the cleaners' key -> offset maps."),
        _d("log.cleaner.io.buffer.size", "524288", "int", "Read buffer of a cleaner."),
        _d("log.cleaner.io.buffer.load.factor", "0.9", "double", "How full a cleaner's offset map may get."),
        _d("log.cleaner.min.cleanable.ratio", "0.5", "double", "Dirty share of a log that makes it cleanable."),
        _d("log.cleaner.min.compaction.lag.ms", "0", "long", "Minimum age of a record before it is compacted."),
        _d("log.cleaner.max.compaction.lag.ms", "9223372036854775807", "long", "Age that forces compaction."),
        _d("log.cleaner.delete.retention.ms", "86400000", "long", "How long tombstones are kept once cleaned."),
        _d("log.flush.offset.checkpoint.interval.ms", "60000", "int", "Recovery point checkpoint period."),
        _d("log.flush.start.offset.checkpoint.interval.ms", "60000", "int", "Log start checkpoint period."),
        _d("replica.high.watermark.checkpoint.interval.ms", "5000", "long", "HW checkpoint period."),
        _d("controller.quorum.voters", "", "list", "Controller voters as id@host:port; empty: this node."),
        _d("controller.quorum.bootstrap.servers", "", "list", "Controller host:port list (KIP-853)."),
        _d("controller.listener.names", "CONTROLLER", "list", "Listeners that serve only the controller."),
        _d("inter.broker.listener.name", "", "string", "Listener brokers use to reach each other."),
        _d("metadata.log.dir", "", "string", "Directory of __cluster_metadata-0; default: first of log.dirs."),
        _d("broker.session.timeout.ms", "9000", "int", "A broker without a heartbeat this long is fenced."),
        _d("broker.heartbeat.interval.ms", "2000", "int", "Period of broker heartbeats to the controller."),
        _d("replica.lag.time.max.ms", "30000", "long", "A follower not caught up this long leaves the ISR."),
        _d("replica.fetch.wait.max.ms", "500", "int", "Longest wait of a follower fetch at the leader."),
        _d("replica.fetch.min.bytes", "1", "int", "Bytes a follower fetch waits for."),
        _d("replica.fetch.max.bytes", "1048576", "int", "Bytes a follower fetches per partition."),
        _d("replica.fetch.response.max.bytes", "10485760", "int", "Bytes a follower fetches per request."),
        _d("replica.fetch.backoff.ms", "1000", "int", "Pause of a follower partition after a fetch error."),
        _d("replica.socket.timeout.ms", "30000", "int", "Timeout of inter-broker requests."),
        _d("unclean.leader.election.enable", "false", "boolean", "Elect an out-of-sync replica as last resort."),
        _d("producer.id.expiration.ms", "86400000", "int", "Idle time after which a producer's state is dropped."),
        _d("producer.id.expiration.check.interval.ms", "600000", "int", "How often idle producers are dropped."),
        _d("tierlog.http.listener", "", "string", "host:port of /metrics, /v1/partitions, /v1/trace; empty: off."),
        # Tiered storage (KIP-405), Kafka's names and defaults.
        _d("remote.log.storage.system.enable", "false", "boolean", "Enable the remote tier on this broker."),
        _d("remote.log.storage.manager.class.name", "", "string", "RemoteStorageManager; empty: fsspec's."),
        _d("remote.log.storage.manager.impl.prefix", "rsm.config.", "string", "Prefix of RSM settings."),
        _d("remote.log.metadata.manager.impl.prefix", "rlmm.config.", "string", "Prefix of RLMM settings."),
        _d("remote.log.manager.task.interval.ms", "30000", "long", "Period of the copy and expiration tasks."),
        _d("remote.log.manager.copier.thread.pool.size", "10", "int", "Threads copying segments."),
        _d("remote.log.reader.threads", "10", "int", "Threads reading the remote tier for fetches."),
        _d("remote.fetch.max.wait.ms", "500", "int", "Longest wait of a fetch served from the remote tier."),
        _d("remote.log.index.file.cache.total.size.bytes", "1073741824", "long", "Bound of the index cache."),
        _d("remote.log.metadata.initialization.retry.interval.ms", "100", "long", "RLMM start-up retry."),
        # Group coordinator and __consumer_offsets, Kafka's names and defaults.
        _d("offsets.topic.num.partitions", "50", "int", "Partitions of __consumer_offsets."),
        _d("offsets.topic.replication.factor", "3", "short", "__consumer_offsets replicas (1 if standalone)."),
        _d("offsets.topic.segment.bytes", "104857600", "int", "Segment size of __consumer_offsets."),
        _d("offsets.load.buffer.size", "5242880", "int", "Bytes read at a time when loading groups."),
        _d("offsets.commit.timeout.ms", "5000", "int", "Longest wait for a commit to be replicated."),
        _d("offsets.retention.minutes", "10080", "int", "How long offsets of an empty group are kept."),
        _d("offsets.retention.check.interval.ms", "600000", "long", "How often expired offsets are removed."),
        _d("offset.metadata.max.bytes", "4096", "int", "Largest metadata string of an offset commit."),
        _d("group.min.session.timeout.ms", "6000", "int", "Smallest session timeout a member may ask for."),
        _d("group.max.session.timeout.ms", "1800000", "int", "Largest session timeout a member may ask for."),
        _d("group.initial.rebalance.delay.ms", "3000", "int", "Wait for more members at a group's first join."),
        _d("group.max.size", "2147483647", "int", "Most members of one consumer group."),
    )
}

# Kafka accepts the legacy name too.
_SYNONYMS = {"broker.id": "node.id", "log.dir": "log.dirs"}


class ConfigError(ValueError):
    """A configuration a person must fix; the message is one line that says what and where."""


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties subset that server.properties files use: `key=value` or `key: value`, # and ! comments,
    backslash line continuations."""
    props: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep < 0:
            props[line] = ""
            continue
        props[line[:sep].strip()] = line[sep + 1 :].strip()
    return props


def parse_listener(uri: str) -> Listener:
    """`PLAINTEXT://host:port`; an empty host means every interface, as in Kafka."""
    name, sep, _ = uri.partition("://")
    if not sep:
        raise ConfigError(f"listener {uri!r} is not of the form NAME://host:port")
    parts = urlsplit("tcp://" + uri.split("://", 1)[1])
    if parts.port is None:
        raise ConfigError(f"listener {uri!r} has no port")
    return Listener(name.upper(), parts.hostname or "", parts.port)


def parse_host_port(name: str, address: str) -> tuple[str, int]:
    """`host:port` (an empty host means 127.0.0.1)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{name} {address!r} is not host:port")
    return host or "127.0.0.1", int(port)


class KafkaConfig:
    """Broker settings: the explicit properties laid over the embedded defaults."""

    def __init__(self, props: Mapping[str, str] | None = None) -> None:
        self.originals: dict[str, str] = {}
        for key, value in (props or {}).items():
            self.originals[_SYNONYMS.get(key, key)] = value
        for key in sorted(set(self.originals) - set(BROKER_CONFIGS)):
            if not key.startswith(("log.", "controller.", "listener.", "inter.broker.", "group.")):
                log.debug("configuration %s is not used by tierlog", key)
        self._check()

    @classmethod
    def from_file(cls, path: Path | None, overrides: Mapping[str, str] | None = None) -> KafkaConfig:
        props: dict[str, str] = {}
        if path is not None:
            try:
                props = parse_properties(path.read_text())
            except OSError as e:
                raise ConfigError(f"cannot read {path}: {e.strerror}") from None
        props.update(overrides or {})
        return cls(props)

    def get(self, name: str) -> str:
        if name in self.originals:
            return self.originals[name]
        return BROKER_CONFIGS[name].default

    def get_int(self, name: str) -> int:
        value = self.get(name)
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{name}={value!r} is not an integer") from None

    def get_bool(self, name: str) -> bool:
        value = self.get(name).strip().lower()
        if value not in ("true", "false"):
            raise ConfigError(f"{name}={value!r} must be true or false")
        return value == "true"

    def get_list(self, name: str) -> list[str]:
        return [item.strip() for item in self.get(name).split(",") if item.strip()]

    def _check(self) -> None:
        for name, definition in BROKER_CONFIGS.items():
            if definition.type in ("short", "int", "long"):
                self.get_int(name)
            elif definition.type == "boolean":
                self.get_bool(name)
        if not self.listeners:
            raise ConfigError("listeners is empty: set e.g. listeners=PLAINTEXT://127.0.0.1:9092")
        if not self.log_dirs:
            raise ConfigError("log.dirs is empty")
        roles = self.process_roles
        if not roles or roles - {"broker", "controller"}:
            raise ConfigError(f"process.roles={self.get('process.roles')!r} must be broker, controller or both")
        if "broker" not in roles:
            raise ConfigError(
                "process.roles=controller (a dedicated controller) is not supported yet: use broker,controller"
            )
        self.http_listener  # noqa: B018 (refuses a malformed address at start-up, not after the broker came up)
        if not self.is_controller and self.controller_address is None:
            raise ConfigError(
                "process.roles=broker needs controller.quorum.voters or controller.quorum.bootstrap.servers"
            )

    @property
    def node_id(self) -> int:
        return self.get_int("node.id")

    @property
    def is_controller(self) -> bool:
        return "controller" in self.process_roles

    @property
    def process_roles(self) -> set[str]:
        return {role.lower() for role in self.get_list("process.roles")}

    @property
    def controller_address(self) -> tuple[str, int] | None:
        """Where the controller listens: `controller.quorum.bootstrap.servers`, else the first of
        `controller.quorum.voters`; None when neither is set (this node is its own controller)."""
        servers = self.get_list("controller.quorum.bootstrap.servers")
        if not servers:
            servers = [voter.partition("@")[2] for voter in self.get_list("controller.quorum.voters")]
        if not servers:
            return None
        return parse_host_port("controller address", servers[0])

    @property
    def is_standalone(self) -> bool:
        """No controller.quorum.voters nor bootstrap servers: this node is its own controller, the one-broker
        cluster `tierlog broker` starts on embedded defaults."""
        return self.controller_address is None

    def internal_topic_replication_factor(self, name: str, configured: Mapping[str, str] | None = None) -> int:
        """The replication factor of an internal topic (`offsets.topic.replication.factor`, or an rlmm.config.
        one in `configured`): as set, else 1 on a standalone node (Kafka's single-node server.properties sets
        these to 1, so groups and tiered storage work out of the box) and the Kafka default of 3 otherwise."""
        values = self.originals if configured is None else configured
        if name in values:
            try:
                return int(values[name])
            except ValueError:
                raise ConfigError(f"{name}={values[name]!r} is not an integer") from None
        return 1 if self.is_standalone else 3

    @property
    def http_listener(self) -> tuple[str, int] | None:
        """`tierlog.http.listener` (host:port) for /metrics, /v1/partitions and /v1/trace; None when off."""
        address = self.get("tierlog.http.listener")
        return parse_host_port("tierlog.http.listener", address) if address else None

    @property
    def controller_listeners(self) -> list[Listener]:
        names = {n.upper() for n in self.get_list("controller.listener.names")}
        return [listener for listener in map(parse_listener, self.get_list("listeners")) if listener.name in names]

    @property
    def inter_broker_listener_name(self) -> str:
        return self.get("inter.broker.listener.name").upper() or self.listeners[0].name

    @property
    def metadata_log_dir(self) -> Path:
        configured = self.get("metadata.log.dir")
        return Path(configured).expanduser() if configured else self.log_dirs[0]

    @property
    def listeners(self) -> list[Listener]:
        listeners = [parse_listener(uri) for uri in self.get_list("listeners")]
        controller_names = (
            {n.upper() for n in self.get_list("controller.listener.names")}
            if ("controller.listener.names" in self.originals)
            else {"CONTROLLER"}
        )
        return [listener for listener in listeners if listener.name not in controller_names]

    @property
    def advertised_listeners(self) -> list[Listener]:
        """What the broker registers and Metadata tells clients: `advertised.listeners`, else `listeners`, with
        a wildcard host replaced by 127.0.0.1 (a client cannot connect to 0.0.0.0)."""
        advertised = [parse_listener(uri) for uri in self.get_list("advertised.listeners")] or self.listeners
        return [
            Listener(listener.name, "127.0.0.1", listener.port) if listener.host in ("", "0.0.0.0", "::") else listener
            for listener in advertised
        ]

    @property
    def advertised_listener(self) -> Listener:
        return self.advertised_listeners[0]

    @property
    def log_dirs(self) -> list[Path]:
        return [Path(d).expanduser() for d in self.get_list("log.dirs")]

    @property
    def remote_storage_system_enable(self) -> bool:
        return self.get_bool("remote.log.storage.system.enable")

    def prefixed(self, prefix_config: str) -> dict[str, str]:
        """The properties under the prefix named by `prefix_config` (e.g. rsm.config.*), prefix stripped:
        the settings Kafka hands to a remote storage or metadata manager plugin."""
        prefix = self.get(prefix_config)
        return {k[len(prefix) :]: v for k, v in self.originals.items() if k.startswith(prefix)}

    def broker_log_defaults(self) -> dict[str, str]:
        """Every explicit property: LogConfig picks the `log.*` and other broker synonyms it knows."""
        return dict(self.originals)

    def describe(self) -> list[tuple[str, str, bool]]:
        """(name, value, is_default) for DescribeConfigs on the broker resource."""
        names = sorted(set(BROKER_CONFIGS) | set(self.originals))
        return [(n, self.get(n) if n in BROKER_CONFIGS else self.originals[n], n not in self.originals) for n in names]
