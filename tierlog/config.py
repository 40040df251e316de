"""Broker configuration: a `server.properties` file with Kafka's names, types, defaults and validation.

Every setting has an embedded default so `tierlog broker` alone starts a working broker on 127.0.0.1:9092.
Every setting tierlog knows is typed and validated when the configuration is read, before the broker touches
a disk or a socket, and a bad one is refused with Kafka's one-line message naming the key, the value and the
rule. Settings of features tierlog does not have yet (SASL plugins, authorizers other than StandardAuthorizer,
ZooKeeper mode) are refused the same way rather than ignored. Names
tierlog does not know are logged once at start-up, as Kafka does, and otherwise left alone, so a real Kafka
`server.properties` starts a tierlog broker. The rules are in docs/configuration.md.

The broker defaults of topic configs (`log.segment.bytes`, `log.retention.ms`, ...) are defined from the topic
config table of `tierlog.storage.log_config`, which resolves a topic's effective values from them.
"""

from __future__ import annotations

import functools
import logging
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tierlog.client.security import SASL_PROTOCOLS, SECURITY_PROTOCOLS, TLS_PROTOCOLS, ClientSecurity
from tierlog.config_def import ConfigDef, ConfigException, Validator, invalid, parse_config_value, parse_typed, render
from tierlog.security.authorizer import STANDARD_AUTHORIZER, parse_super_users
from tierlog.security.jaas import (
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    JaasConfigError,
    JaasLoginModule,
    parse_jaas_config,
)
from tierlog.security.sasl import PLAIN, SUPPORTED_MECHANISMS
from tierlog.security.ssl_context import (
    CLIENT_AUTH_MODES,
    SslConfigError,
    SslSettings,
    client_context,
    mapping_rules_problem,
    server_context,
    settings_problem,
)
from tierlog.storage.log_config import ALL_TOPIC_CONFIGS, TOPIC_CONFIGS, LogConfig
from tierlog.storage.offset_map import BYTES_PER_ENTRY

log = logging.getLogger(__name__)

DEFAULT_SECURITY_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
FSSPEC_RSM_CLASS_NAME = "tierlog.tiered.fsspec_storage.FsspecRemoteStorageManager"

# Kafka's CoreUtils.listenerListToEndPoints pattern: NAME://host:port, the host optionally in [brackets].
_LISTENER = re.compile(r"^([A-Za-z0-9_]+)://\[?([0-9a-zA-Z\-%._:]*?)\]?:(-?[0-9]+)$")
_HOST_PORT = re.compile(r"^\[?([0-9a-zA-Z\-%._:]*?)\]?:([0-9]+)$")


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int


def _listener_problem(uri: str) -> str | None:
    match = _LISTENER.match(uri)
    if match is None:
        return "expected NAME://host:port"
    if not 0 <= int(match.group(3)) <= 65535:
        return f"port {match.group(3)} is not between 0 and 65535"
    return None


def _each(entries: object, problem_of: Callable[[str], str | None]) -> str | None:
    """The first entry's problem; the entry is named when the list has several."""
    items = entries if isinstance(entries, tuple) else ()
    for entry in items:
        problem = problem_of(entry)
        if problem is not None:
            return f"{problem} (in {entry})" if len(items) > 1 else problem
    return None


def _super_users_problem(value: object) -> str | None:
    try:
        parse_super_users(str(value))
    except ValueError as e:
        return str(e)
    return None


def _listeners_problem(value: object) -> str | None:
    problem = _each(value, _listener_problem)
    if problem is not None:
        return problem
    names = [uri.partition("://")[0].upper() for uri in value]  # type: ignore[attr-defined]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        return f"each listener must have a different name, {', '.join(duplicates)} is used twice"
    return None


def _host_port_problem(entry: str) -> str | None:
    match = _HOST_PORT.match(entry)
    if match is None or not match.group(1):
        return "expected host:port"
    if not 0 < int(match.group(2)) <= 65535:
        return f"port {match.group(2)} is not between 1 and 65535"
    return None


def _voter_problem(entry: str) -> str | None:
    """Kafka's ControllerQuorumVotersValidator: each entry is {id}@{host}:{port}."""
    node_id, at, address = entry.partition("@")
    if not at or "@" in address:
        return "each entry should be in the form {id}@{host}:{port}"
    if not node_id.strip().isdigit():
        return f"voter id {node_id!r} is not an integer"
    return _host_port_problem(address)


def _security_protocol_map_problem(value: object) -> str | None:
    for entry in str(value).split(","):
        name, colon, protocol = entry.strip().partition(":")
        if not colon or not name:
            return f"{entry.strip()} is not of the form LISTENER_NAME:SECURITY_PROTOCOL"
        if protocol.strip().upper() not in SECURITY_PROTOCOLS:
            return f"{protocol.strip()} is not a security protocol ({', '.join(SECURITY_PROTOCOLS)})"
    return None


def _optional_host_port_problem(value: object) -> str | None:
    return _host_port_problem(str(value)) if value else None


def _rsm_class_problem(value: object) -> str | None:
    if value in ("", FSSPEC_RSM_CLASS_NAME):
        return None
    return f"tierlog ships {FSSPEC_RSM_CLASS_NAME} (file://, s3://, memory:// through fsspec); leave it empty to use it"


def _d(
    name: str,
    default: str | None,
    type_: str,
    doc: str,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    choices: tuple[str, ...] | None = None,
    validator: Validator | None = None,
) -> ConfigDef:
    """A broker config whose default is written as in a server.properties file; None: no default."""
    typed = None if default is None else parse_typed(name, type_, default)
    return ConfigDef(name, type_, typed, doc, at_least=at_least, at_most=at_most, choices=choices, validator=validator)


# Kafka's ssl.* settings that tierlog reads (docs/security.md#tls); each may be set per listener as
# listener.name.<lower-case listener name>.ssl.*, which takes precedence.
_SSL_CONFIGS: tuple[ConfigDef, ...] = (
    _d("ssl.keystore.type", "JKS", "string", "Format of the key store; tierlog reads PEM."),
    _d("ssl.keystore.location", None, "string", "PEM file with the private key and the certificate chain."),
    _d("ssl.keystore.password", None, "password", "Password of a JKS/PKCS12 key store; not used with PEM."),
    _d("ssl.key.password", None, "password", "Password of the private key in the key store, if encrypted."),
    _d("ssl.keystore.certificate.chain", None, "password", "Inline PEM certificate chain (with ssl.keystore.key)."),
    _d("ssl.keystore.key", None, "password", "Inline PEM private key (with ssl.keystore.certificate.chain)."),
    _d("ssl.truststore.type", "JKS", "string", "Format of the trust store; tierlog reads PEM."),
    _d("ssl.truststore.location", None, "string", "PEM file with the trusted CA certificates."),
    _d("ssl.truststore.password", None, "password", "Password of a JKS/PKCS12 trust store; not used with PEM."),
    _d("ssl.truststore.certificates", None, "password", "Inline PEM trusted certificates."),
    _d("ssl.client.auth", "none", "string", "Ask clients for a certificate.", choices=CLIENT_AUTH_MODES),
    _d("ssl.enabled.protocols", "TLSv1.2,TLSv1.3", "list", "TLS versions enabled."),
    _d("ssl.protocol", "TLSv1.3", "string", "TLS protocol of the context (TLSv1.2 caps the version at 1.2)."),
    _d("ssl.cipher.suites", "", "list", "TLS 1.2 cipher suites (OpenSSL names); empty: OpenSSL's defaults."),
    _d(
        "ssl.endpoint.identification.algorithm",
        "https",
        "string",
        "Host name check of the broker's own TLS connections; empty: off.",
    ),
    _d(
        "ssl.principal.mapping.rules",
        "DEFAULT",
        "string",
        "Rules mapping a client certificate's subject to a user name.",
        validator=lambda value: mapping_rules_problem(str(value)),
    ),
)
_SSL_CONFIG_NAMES = frozenset(d.name for d in _SSL_CONFIGS)

_BROKER_OWN_CONFIGS: tuple[ConfigDef, ...] = (
    _d("node.id", "1", "int", "The node id of this server.", at_least=0),
    _d("process.roles", "broker,controller", "list", "The roles this node plays.", choices=("broker", "controller")),
    _d(
        "listeners",
        "PLAINTEXT://127.0.0.1:9092",
        "list",
        "Listener URIs the broker binds.",
        validator=_listeners_problem,
    ),
    _d(
        "advertised.listeners",
        "",
        "list",
        "Listeners given to clients; defaults to listeners.",
        validator=_listeners_problem,
    ),
    _d(
        "listener.security.protocol.map",
        DEFAULT_SECURITY_PROTOCOL_MAP,
        "string",
        "Security protocol of each listener name.",
        validator=_security_protocol_map_problem,
    ),
    _d(
        "security.inter.broker.protocol",
        "PLAINTEXT",
        "string",
        "Security protocol between brokers.",
        choices=SECURITY_PROTOCOLS,
    ),
    _d(
        "authorizer.class.name",
        "",
        "string",
        f"The authorizer of requests: {STANDARD_AUTHORIZER}, or empty for none (every client may do everything).",
    ),
    _d(
        "super.users",
        "",
        "string",
        "Principals the authorizer allows everything, separated by semicolons (User:admin;User:ops).",
        validator=_super_users_problem,
    ),
    _d(
        "allow.everyone.if.no.acl.found",
        "false",
        "boolean",
        "Whether the authorizer allows an action on a resource that has no ACL at all.",
    ),
    *_SSL_CONFIGS,
    # SASL (docs/security.md#sasl). Kafka's defaults are GSSAPI, which tierlog does not implement: a SASL listener
    # left at the default is refused at start-up rather than given another mechanism.
    _d(
        "sasl.enabled.mechanisms",
        "GSSAPI",
        "list",
        "SASL mechanisms of SASL listeners (per listener: listener.name.<name>.sasl.enabled.mechanisms).",
    ),
    _d("sasl.mechanism.inter.broker.protocol", "GSSAPI", "string", "SASL mechanism brokers use with each other."),
    _d("sasl.mechanism.controller.protocol", "GSSAPI", "string", "SASL mechanism brokers use with the controller."),
    _d(
        "sasl.server.max.receive.size",
        "524288",
        "int",
        "Largest frame a client may send before it is authenticated.",
        at_least=1,
    ),
    _d(
        "connections.max.reauth.ms",
        "0",
        "long",
        "Session lifetime of SASL connections (KIP-368): clients re-authenticate within it or are disconnected; "
        "0: sessions do not expire.",
        at_least=0,
    ),
    _d(
        "tierlog.sasl.authentication.timeout.ms",
        "30000",
        "int",
        "Longest time from connect to authenticated on a SASL listener; the connection is closed after it.",
        at_least=1,
    ),
    _d("zookeeper.connect", None, "string", "ZooKeeper mode; tierlog runs in KRaft mode only."),
    _d("log.dirs", "/tmp/tierlog-logs", "list", "Directories where partition data is kept."),
    _d("num.partitions", "1", "int", "Default partition count of auto-created topics.", at_least=1),
    # Kafka leaves this one unchecked until a topic is created; a factor below 1 can create no topic at all, so
    # tierlog refuses it at start-up.
    _d("default.replication.factor", "1", "int", "Default replication factor of new topics.", at_least=1),
    _d("auto.create.topics.enable", "true", "boolean", "Create unknown topics on metadata request."),
    _d("delete.topic.enable", "true", "boolean", "Allow DeleteTopics."),
    _d("socket.request.max.bytes", "104857600", "int", "Largest request frame accepted.", at_least=1),
    # The wait of a transaction marker's acks=all append (docs/transactions.md#write-txn-markers).
    _d("request.timeout.ms", "30000", "int", "Longest wait of a broker's own acks=all appends.", at_least=0),
    _d("message.max.bytes", "1048588", "int", "Largest record batch accepted (max.message.bytes).", at_least=0),
    _d("fetch.max.bytes", "57671680", "int", "Upper bound of bytes in one fetch response.", at_least=1024),
    _d("min.insync.replicas", "1", "int", "ISR size needed for acks=all.", at_least=1),
    _d("log.retention.check.interval.ms", "300000", "long", "How often retention runs.", at_least=1),
    # The log cleaner (compaction of cleanup.policy=compact topics); the last four are the brokers'
    # defaults of the topic configs min.cleanable.dirty.ratio, min/max.compaction.lag.ms, delete.retention.ms.
    _d("log.cleaner.enable", "true", "boolean", "Run the log cleaner, which compacts compacted topics."),
    # Kafka declares atLeast(0) but then divides the dedupe buffer by the thread count: 0 fails there too.
    _d("log.cleaner.threads", "1", "int", "Logs cleaned at the same time; they share the dedupe buffer.", at_least=1),
    _d("log.cleaner.backoff.ms", "15000", "long", "Pause of the cleaner when no log needs cleaning.", at_least=0),
    _d("log.cleaner.dedupe.buffer.size", "134217728", "long", "Memory of the cleaners' key -> offset maps."),
    _d("log.cleaner.io.buffer.size", "524288", "int", "Read buffer of a cleaner.", at_least=0),
    _d("log.cleaner.io.buffer.load.factor", "0.9", "double", "How full a cleaner's offset map may get."),
    _d(
        "log.cleaner.min.cleanable.ratio",
        "0.5",
        "double",
        "Dirty share of a log that makes it cleanable.",
        at_least=0,
        at_most=1,
    ),
    _d(
        "log.cleaner.min.compaction.lag.ms",
        "0",
        "long",
        "Minimum age of a record before it is compacted.",
        at_least=0,
    ),
    _d(
        "log.cleaner.max.compaction.lag.ms",
        "9223372036854775807",
        "long",
        "Age that forces compaction.",
        at_least=1,
    ),
    _d(
        "log.cleaner.delete.retention.ms",
        "86400000",
        "long",
        "How long tombstones are kept once cleaned.",
        at_least=0,
    ),
    # The periods of the broker's timers: Kafka's scheduler refuses a period of 0 at start-up too.
    _d(
        "log.flush.offset.checkpoint.interval.ms",
        "60000",
        "int",
        "Recovery point checkpoint period.",
        at_least=1,
    ),
    _d(
        "log.flush.start.offset.checkpoint.interval.ms",
        "60000",
        "int",
        "Log start checkpoint period.",
        at_least=1,
    ),
    _d("replica.high.watermark.checkpoint.interval.ms", "5000", "long", "HW checkpoint period.", at_least=1),
    _d(
        "controller.quorum.voters",
        "",
        "list",
        "Controller voters as id@host:port; empty: this node.",
        validator=lambda value: _each(value, _voter_problem),
    ),
    _d(
        "controller.quorum.bootstrap.servers",
        "",
        "list",
        "Controller host:port list (KIP-853).",
        validator=lambda value: _each(value, _host_port_problem),
    ),
    _d("controller.listener.names", "CONTROLLER", "list", "Listeners that serve only the controller."),
    # The controller quorum's Raft timers (Kafka's QuorumConfig, same names and defaults; docs/quorum.md).
    _d(
        "controller.quorum.election.timeout.ms",
        "1000",
        "int",
        "Time without a leader before a voter starts an election.",
        at_least=1,
    ),
    _d(
        "controller.quorum.fetch.timeout.ms",
        "2000",
        "int",
        "Time without a fetch from the leader (or, for it, a majority) before an election.",
        at_least=1,
    ),
    _d(
        "controller.quorum.election.backoff.max.ms",
        "1000",
        "int",
        "Longest pause before a lost election is tried again.",
        at_least=1,
    ),
    _d(
        "controller.quorum.append.linger.ms",
        "25",
        "int",
        "Accepted for Kafka's sake: tierlog appends one batch per controller operation.",
        at_least=0,
    ),
    _d(
        "controller.quorum.request.timeout.ms",
        "2000",
        "int",
        "Time a quorum request waits for its response.",
        at_least=1,
    ),
    _d(
        "controller.quorum.retry.backoff.ms",
        "20",
        "int",
        "Pause before a failed quorum request is retried.",
        at_least=0,
    ),
    _d("inter.broker.listener.name", "", "string", "Listener brokers use to reach each other."),
    _d("metadata.log.dir", "", "string", "Directory of __cluster_metadata-0; default: first of log.dirs."),
    # When a node snapshots its metadata image (docs/quorum.md#snapshots): whichever limit is reached first.
    _d(
        "metadata.log.max.record.bytes.between.snapshots",
        "20971520",
        "long",
        "Bytes of committed metadata records after the latest snapshot that make a new one.",
        at_least=1,
    ),
    _d(
        "metadata.log.max.snapshot.interval.ms",
        "3600000",
        "long",
        "Longest time committed metadata records wait for a snapshot; 0: no time-based snapshots.",
        at_least=0,
    ),
    _d(
        "broker.session.timeout.ms",
        "9000",
        "int",
        "A broker without a heartbeat this long is fenced.",
        at_least=1,
    ),
    _d("broker.heartbeat.interval.ms", "2000", "int", "Period of broker heartbeats to the controller.", at_least=1),
    _d(
        "replica.lag.time.max.ms",
        "30000",
        "long",
        "A follower not caught up this long leaves the ISR.",
        at_least=1,
    ),
    _d("replica.fetch.wait.max.ms", "500", "int", "Longest wait of a follower fetch at the leader.", at_least=0),
    _d("replica.fetch.min.bytes", "1", "int", "Bytes a follower fetch waits for.", at_least=0),
    _d("replica.fetch.max.bytes", "1048576", "int", "Bytes a follower fetches per partition.", at_least=0),
    _d("replica.fetch.response.max.bytes", "10485760", "int", "Bytes a follower fetches per request.", at_least=0),
    # Fetch sessions (KIP-227, docs/performance.md#fetch-sessions).
    _d(
        "max.incremental.fetch.session.cache.slots",
        "1000",
        "int",
        "Most fetch sessions (KIP-227) the broker caches.",
        at_least=0,
    ),
    _d(
        "min.incremental.fetch.session.eviction.ms",
        "120000",
        "int",
        "How long a fetch session is safe from eviction after creation.",
        at_least=0,
    ),
    _d("replica.fetch.backoff.ms", "1000", "int", "Pause of a follower partition after a fetch error.", at_least=0),
    _d("replica.socket.timeout.ms", "30000", "int", "Timeout of inter-broker requests.", at_least=1),
    _d(
        "replication.quota.window.num",
        "11",
        "int",
        "The number of samples to retain in memory for replication quotas.",
        at_least=1,
    ),
    _d(
        "replication.quota.window.size.seconds",
        "1",
        "int",
        "The time span of each sample for replication quotas.",
        at_least=1,
    ),
    _d(
        "leader.replication.throttled.rate",
        "9223372036854775807",
        "long",
        "Upper bound (bytes/s) on the replication this broker serves as leader for the replicas of "
        "leader.replication.throttled.replicas. Dynamic only.",
        at_least=0,
    ),
    _d(
        "follower.replication.throttled.rate",
        "9223372036854775807",
        "long",
        "Upper bound (bytes/s) on the replication this broker fetches as follower for the replicas of "
        "follower.replication.throttled.replicas. Dynamic only.",
        at_least=0,
    ),
    _d("unclean.leader.election.enable", "false", "boolean", "Elect an out-of-sync replica as last resort."),
    # Leader balancing by the controller, Kafka's names, types and defaults.
    _d("auto.leader.rebalance.enable", "true", "boolean", "Move leaders back to preferred replicas periodically."),
    _d(
        "leader.imbalance.check.interval.seconds",
        "300",
        "long",
        "Wait after an imbalance before leaders move back.",
        at_least=1,
    ),
    # Kafka's KRaft controller defines but never reads it (only the ZooKeeper controller did): neither does
    # tierlog's, which rebalances any partition not led by its preferred replica. docs/replication.md.
    _d("leader.imbalance.per.broker.percentage", "10", "int", "Unused by KRaft controllers (Kafka's too)."),
    _d(
        "producer.id.expiration.ms",
        "86400000",
        "int",
        "Idle time after which a producer's state is dropped.",
        at_least=1,
    ),
    _d(
        "producer.id.expiration.check.interval.ms",
        "600000",
        "int",
        "How often idle producers are dropped.",
        at_least=1,
    ),
    _d(
        "tierlog.http.listener",
        "",
        "string",
        "host:port of /metrics, /v1/partitions, /v1/trace; empty: off.",
        validator=_optional_host_port_problem,
    ),
    # Tiered storage (KIP-405), Kafka's names and defaults.
    _d("remote.log.storage.system.enable", "false", "boolean", "Enable the remote tier on this broker."),
    _d(
        "remote.log.storage.manager.class.name",
        "",
        "string",
        "RemoteStorageManager; empty: fsspec's.",
        validator=_rsm_class_problem,
    ),
    _d("remote.log.storage.manager.impl.prefix", "rsm.config.", "string", "Prefix of RSM settings."),
    _d("remote.log.metadata.manager.impl.prefix", "rlmm.config.", "string", "Prefix of RLMM settings."),
    _d(
        "remote.log.manager.task.interval.ms",
        "30000",
        "long",
        "Period of the copy and expiration tasks.",
        at_least=1,
    ),
    _d("remote.log.manager.copier.thread.pool.size", "10", "int", "Threads copying segments.", at_least=1),
    _d("remote.log.reader.threads", "10", "int", "Threads reading the remote tier for fetches.", at_least=1),
    _d("remote.fetch.max.wait.ms", "500", "int", "Longest wait of a fetch served from the remote tier.", at_least=1),
    _d(
        "remote.log.index.file.cache.total.size.bytes",
        "1073741824",
        "long",
        "Bound of the index cache.",
        at_least=1,
    ),
    _d(
        "remote.log.metadata.initialization.retry.interval.ms",
        "100",
        "long",
        "RLMM start-up retry.",
        at_least=0,
    ),
    # Group coordinator and __consumer_offsets, Kafka's names and defaults.
    _d("offsets.topic.num.partitions", "50", "int", "Partitions of __consumer_offsets.", at_least=1),
    _d(
        "offsets.topic.replication.factor",
        "3",
        "short",
        "__consumer_offsets replicas (1 if standalone).",
        at_least=1,
    ),
    _d("offsets.topic.segment.bytes", "104857600", "int", "Segment size of __consumer_offsets.", at_least=1),
    _d("offsets.load.buffer.size", "5242880", "int", "Bytes read at a time when loading groups.", at_least=1),
    _d("offsets.commit.timeout.ms", "5000", "int", "Longest wait for a commit to be replicated.", at_least=1),
    _d("offsets.retention.minutes", "10080", "int", "How long offsets of an empty group are kept.", at_least=1),
    _d(
        "offsets.retention.check.interval.ms",
        "600000",
        "long",
        "How often expired offsets are removed.",
        at_least=1,
    ),
    _d("offset.metadata.max.bytes", "4096", "int", "Largest metadata string of an offset commit."),
    _d("group.min.session.timeout.ms", "6000", "int", "Smallest session timeout a member may ask for."),
    _d("group.max.session.timeout.ms", "1800000", "int", "Largest session timeout a member may ask for."),
    _d("group.initial.rebalance.delay.ms", "3000", "int", "Wait for more members at a group's first join."),
    _d("group.max.size", "2147483647", "int", "Most members of one consumer group.", at_least=1),
    # The transaction coordinator and __transaction_state, Kafka's names and defaults (docs/transactions.md).
    _d("transaction.state.log.num.partitions", "50", "int", "Partitions of __transaction_state.", at_least=1),
    _d(
        "transaction.state.log.replication.factor",
        "3",
        "short",
        "__transaction_state replicas (1 if standalone).",
        at_least=1,
    ),
    _d("transaction.state.log.min.isr", "2", "int", "min.insync.replicas of __transaction_state.", at_least=1),
    _d(
        "transaction.state.log.segment.bytes",
        "104857600",
        "int",
        "Segment size of __transaction_state.",
        at_least=1,
    ),
    _d(
        "transaction.state.log.load.buffer.size",
        "5242880",
        "int",
        "Bytes read at a time when loading transactions.",
        at_least=1,
    ),
    _d(
        "transaction.max.timeout.ms", "900000", "int", "Largest transaction timeout a producer may ask for.", at_least=1
    ),
    _d(
        "transactional.id.expiration.ms",
        "604800000",
        "int",
        "Idle time after which a transactional id is forgotten.",
        at_least=1,
    ),
    _d(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "10000",
        "int",
        "How often transactions past their timeout are aborted.",
        at_least=1,
    ),
    _d(
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        "3600000",
        "int",
        "How often expired transactional ids are removed.",
        at_least=1,
    ),
    # Broker settings of topic configs that Kafka resolves through coarser units (KafkaConfig
    # .logRetentionTimeMillis, .logRollTimeMillis, ...); LogConfig reads them in that order.
    _d("log.retention.ms", None, "long", "Retention time; overrides log.retention.minutes and .hours."),
    _d("log.retention.minutes", None, "int", "Retention time in minutes; overrides log.retention.hours."),
    _d("log.retention.hours", "168", "int", "Retention time in hours."),
    _d("log.roll.ms", None, "long", "Time after which a segment is rolled; overrides log.roll.hours."),
    _d("log.roll.hours", "168", "int", "Time after which a segment is rolled, in hours.", at_least=1),
    _d("log.roll.jitter.ms", None, "long", "Jitter of segment rolls; overrides log.roll.jitter.hours."),
    _d("log.roll.jitter.hours", "0", "int", "Jitter of segment rolls, in hours.", at_least=0),
    _d("log.flush.interval.ms", None, "long", "Longest time between fsyncs; overrides the scheduler interval."),
    _d("log.flush.scheduler.interval.ms", "9223372036854775807", "long", "How often logs are checked for a flush."),
)


def _topic_synonyms(defined: set[str]) -> list[ConfigDef]:
    """The broker settings that give topic configs their defaults (log.segment.bytes for segment.bytes, ...),
    typed and validated as the topic config itself, as Kafka's LogConfig.SERVER_CONFIG_DEF does."""
    synonyms = []
    for topic_config in ALL_TOPIC_CONFIGS.values():
        name = topic_config.broker_synonym
        if name is not None and name not in defined:
            synonyms.append(
                ConfigDef(
                    name,
                    topic_config.type,
                    topic_config.default,
                    f"Default of the topic config {topic_config.name}: {topic_config.doc}",
                    at_least=topic_config.at_least,
                    at_most=topic_config.at_most,
                    choices=topic_config.choices,
                    validator=topic_config.validator,
                )
            )
            defined.add(name)
    return synonyms


BROKER_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in _BROKER_OWN_CONFIGS}
BROKER_CONFIGS.update({d.name: d for d in _topic_synonyms(set(BROKER_CONFIGS))})

# The broker configs tierlog applies while it runs, so AlterConfigs may change them (Kafka's
# DynamicBrokerConfig.AllDynamicConfigs, less what tierlog has no live use for): the broker defaults of topic
# configs (Kafka's DynamicLogConfig: each topic config's primary broker synonym, but message.format.version),
# the log cleaner's settings, the producer id expiration, the remote fetch wait and the replication throttles'
# rates (docs/replication.md#throttles). Every other config is
# read-only, and AlterConfigs refuses it.
DYNAMIC_BROKER_CONFIGS: frozenset[str] = frozenset(
    {
        d.broker_synonym
        for d in ALL_TOPIC_CONFIGS.values()
        if d.broker_synonym is not None and d.name != "message.format.version"
    }
    | {
        "log.cleaner.threads",
        "log.cleaner.dedupe.buffer.size",
        "log.cleaner.io.buffer.size",
        "log.cleaner.io.buffer.load.factor",
        "log.cleaner.backoff.ms",
        "producer.id.expiration.ms",
        "remote.fetch.max.wait.ms",
    }
    | {"leader.replication.throttled.rate", "follower.replication.throttled.rate"}
)
# Configs that only AlterConfigs sets (Kafka's DynamicConfig.Broker quota configs, absent from KafkaConfig): a value
# in server.properties is not used, and DescribeConfigs of a broker lists them only where they are set.
DYNAMIC_ONLY_BROKER_CONFIGS: frozenset[str] = frozenset(
    {"leader.replication.throttled.rate", "follower.replication.throttled.rate"}
)

# Kafka's DescribeConfigs ConfigSource values.
SOURCE_TOPIC_CONFIG = 1
SOURCE_DYNAMIC_BROKER_CONFIG = 2
SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG = 3
SOURCE_STATIC_BROKER_CONFIG = 4
SOURCE_DEFAULT_CONFIG = 5

# Broker configs that set one value in different units, in Kafka's order (DynamicBrokerConfig.brokerConfigSynonyms).
_UNIT_SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)


def broker_config_synonyms(name: str) -> list[str]:
    """The names that set the same value as `name`, in order of precedence (e.g. log.retention.ms, .minutes,
    .hours); just `name` for most configs."""
    for group in _UNIT_SYNONYMS:
        if name in group and (name != "log.flush.scheduler.interval.ms"):
            return list(group)
    return [name]


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """One entry of a DescribeConfigs answer."""

    name: str
    value: str | None
    source: int
    read_only: bool
    synonyms: tuple[ConfigSynonym, ...]
    type: str | None
    doc: str | None
    # Passwords and keys (Kafka's PASSWORD type): DescribeConfigs answers no value for them.
    sensitive: bool = False


# Kafka accepts the legacy names too.
_SYNONYMS = {"broker.id": "node.id", "log.dir": "log.dirs"}

# Kafka's ZooKeeper-mode authorizer, which a KRaft broker refuses.
_ZOOKEEPER_AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
# Per-listener TLS settings: listener.name.<lower-case listener name>.ssl.*.
_LISTENER_SSL_OVERRIDE = re.compile(r"^listener\.name\.([^.]+)\.(ssl\..+)$")
# Kafka's PEM key and trust stores take no store password (only the private key has one).
_PEM_STORE_PASSWORDS = ("ssl.keystore.password", "ssl.truststore.password")


def _is_password(name: str) -> bool:
    """A config of Kafka's PASSWORD type, itself or as a listener.name.<name>.* override."""
    override = _LISTENER_SSL_OVERRIDE.match(name)
    definition = BROKER_CONFIGS.get(override.group(2) if override else name)
    return definition is not None and definition.type == "password"


# Settings that replace how SASL authenticates (plugins, Java classes): ignoring one would authenticate otherwise
# than configured. Refused at the top level and per listener (listener.name.<name>.[<mechanism>.]<setting>).
_UNSUPPORTED_SASL_PLUGINS = (
    "sasl.server.callback.handler.class",
    "sasl.client.callback.handler.class",
    "sasl.login.class",
    "sasl.login.callback.handler.class",
)
# The per-listener SASL settings tierlog reads: listener.name.<name>.sasl.enabled.mechanisms and
# listener.name.<name>.<mechanism>.sasl.jaas.config (names in lower case, as Kafka's).
_LISTENER_SASL_SETTING = re.compile(
    r"^listener\.name\.([^.]+)\.(sasl\.enabled\.mechanisms|(?:plain|scram-sha-256|scram-sha-512)\.sasl\.jaas\.config)$"
)


def _jaas_key(listener_name: str, mechanism: str) -> str:
    return f"listener.name.{listener_name.lower()}.{mechanism.lower()}.sasl.jaas.config"


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


def read_properties(path: Path) -> dict[str, str]:
    """The settings of a .properties file; ConfigException naming the file when it cannot be read."""
    try:
        return parse_properties(path.read_text())
    except OSError as e:
        raise ConfigException(f"cannot read {path}: {e.strerror}") from None


def parse_listener(uri: str) -> Listener:
    """`PLAINTEXT://host:port`; an empty host means every interface, as in Kafka."""
    problem = _listener_problem(uri)
    if problem is not None:
        raise ConfigException(f"listener {problem}")
    match = _LISTENER.match(uri)
    assert match is not None
    return Listener(match.group(1).upper(), match.group(2), int(match.group(3)))


def parse_host_port(name: str, address: str) -> tuple[str, int]:
    """`host:port` (an empty host means 127.0.0.1)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigException(f"{name} {address!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


class KafkaConfig:
    """Broker settings: the explicit properties laid over the embedded defaults, every one validated.

    Dynamic broker configs (set with AlterConfigs, kept in the metadata log) lie over the static ones in
    Kafka's order of precedence: this broker's own, then the cluster-wide defaults, then `server.properties`,
    then the embedded defaults. `reconfigure` swaps the dynamic layers while the broker runs."""

    def __init__(
        self,
        props: Mapping[str, str] | None = None,
        dynamic_defaults: Mapping[str, str] | None = None,
        dynamic_broker: Mapping[str, str] | None = None,
    ) -> None:
        self.originals: dict[str, str] = {}
        for key, value in (props or {}).items():
            self.originals[_SYNONYMS.get(key, key)] = value
        self.dynamic_defaults = dict(dynamic_defaults or {})
        self.dynamic_broker = dict(dynamic_broker or {})
        # Every layer at once, the highest precedence last.
        self.props = {**self.originals, **self.dynamic_defaults, **self.dynamic_broker}
        self._values: dict[str, object] = {}
        dynamic = {**self.dynamic_defaults, **self.dynamic_broker}
        for name, definition in BROKER_CONFIGS.items():
            layers = dynamic if name in DYNAMIC_ONLY_BROKER_CONFIGS else self.props
            if name in layers:
                self._values[name] = parse_config_value(definition, layers[name])
            else:
                self._values[name] = definition.default
        self._check()

    @classmethod
    def from_file(cls, path: Path | None, overrides: Mapping[str, str] | None = None) -> KafkaConfig:
        props = read_properties(path) if path is not None else {}
        props.update(overrides or {})
        return cls(props)

    def get(self, name: str) -> str:
        """The setting as text: as given, else its default as Kafka shows it ('' for no default)."""
        if name in self.props:
            return self.props[name]
        return render(BROKER_CONFIGS[name].default)

    def get_int(self, name: str) -> int:
        value = self._values[name]
        assert isinstance(value, int) and not isinstance(value, bool), f"{name} is not an integer config"
        return value

    def get_double(self, name: str) -> float:
        value = self._values[name]
        assert isinstance(value, float), f"{name} is not a double config"
        return value

    def get_bool(self, name: str) -> bool:
        value = self._values[name]
        assert isinstance(value, bool), f"{name} is not a boolean config"
        return value

    def get_list(self, name: str) -> list[str]:
        value = self._values[name]
        assert isinstance(value, tuple), f"{name} is not a list config"
        return list(value)

    def unused_keys(self) -> list[str]:
        """Supplied settings tierlog does not read: Kafka logs these once at start-up."""
        prefixes = (
            self.get("remote.log.storage.manager.impl.prefix"),
            self.get("remote.log.metadata.manager.impl.prefix"),
        )
        return sorted(
            k
            for k in self.originals
            if (k not in BROKER_CONFIGS or k in DYNAMIC_ONLY_BROKER_CONFIGS)
            and not k.startswith(prefixes)
            and not _LISTENER_SSL_OVERRIDE.match(k)
            and not _LISTENER_SASL_SETTING.match(k)
        )

    def log_unused(self) -> None:
        """Kafka's AbstractConfig.logUnused: one line naming every supplied setting that is not used."""
        unused = self.unused_keys()
        if unused:
            log.warning("These configurations '[%s]' were supplied but are not used yet.", ", ".join(unused))

    def _check(self) -> None:
        """Kafka's KafkaConfig.validateValues, for the settings tierlog has, and the refusal of settings of
        features it does not have yet."""
        if not self.log_dirs:
            raise ConfigException("At least one log directory must be defined via log.dirs or log.dir.")
        if self.get("zookeeper.connect"):
            raise ConfigException(
                "zookeeper.connect is set, but tierlog runs in KRaft mode only: use process.roles, node.id and "
                "controller.quorum.voters instead"
            )
        roles = self.get_list("process.roles")
        if not roles:
            raise invalid("process.roles", "", "give broker, controller or both")
        if len(set(roles)) != len(roles):
            raise ConfigException(f"Duplicate role names found in `process.roles`: {', '.join(roles)}")
        self._check_unsupported_security()
        self._check_quorum()
        self._check_listeners()
        self._check_sasl()
        if self.get_int("replica.fetch.wait.max.ms") > self.get_int("replica.socket.timeout.ms"):
            raise ConfigException("replica.socket.timeout.ms should always be at least replica.fetch.wait.max.ms")
        if self.get_int("replica.fetch.wait.max.ms") > self.get_int("replica.lag.time.max.ms"):
            raise ConfigException(
                "replica.fetch.wait.max.ms should always be less than or equal to replica.lag.time.max.ms"
            )
        # Each cleaner thread's share of the dedupe buffer must hold at least one key (tierlog's bound: Kafka
        # asks for 1 MiB per thread, which rules out the small maps tests use to exercise a full map).
        per_thread = self.get_int("log.cleaner.dedupe.buffer.size") // self.get_int("log.cleaner.threads")
        if int(per_thread // BYTES_PER_ENTRY * self.get_double("log.cleaner.io.buffer.load.factor")) < 1:
            raise ConfigException(
                f"log.cleaner.dedupe.buffer.size={self.get('log.cleaner.dedupe.buffer.size')} is too small for "
                f"{self.get('log.cleaner.threads')} cleaner thread(s): each needs room for at least one key"
            )
        # The topic defaults these settings give must make a valid topic configuration, and Kafka's
        # log.retention rule holds on the resolved value (any negative time means unlimited, 0 is refused).
        defaults = LogConfig.from_props({}, self.props)
        if defaults.retention_ms == 0:
            raise ConfigException("log.retention.ms must be unlimited (-1) or, greater than or equal to 1")
        if defaults.segment_ms < 1:
            raise ConfigException("log.roll.ms must be greater than or equal to 1")

    def _check_unsupported_security(self) -> None:
        for key in sorted(self.originals):
            override = _LISTENER_SSL_OVERRIDE.match(key)
            ssl_name = override.group(2) if override else key
            if ssl_name.startswith("ssl.") and ssl_name not in _SSL_CONFIG_NAMES:
                raise ConfigException(
                    f"{key} is set, but tierlog does not support it: the TLS settings it reads are in "
                    "docs/security.md#tls"
                )
            if override:
                if override.group(1) != override.group(1).lower():
                    # Kafka looks these up by the lower-case name only: another spelling would be ignored.
                    raise ConfigException(
                        f"{key} is set, but listener names in per-listener settings are lower case: "
                        f"listener.name.{override.group(1).lower()}.{ssl_name}"
                    )
                parse_config_value(BROKER_CONFIGS[ssl_name], self.originals[key])
            if key.endswith(_UNSUPPORTED_SASL_PLUGINS):
                raise ConfigException(
                    f"{key} is set, but tierlog does not load SASL plugins: it authenticates PLAIN users from the "
                    "JAAS config and SCRAM users from the metadata log (docs/security.md#sasl)"
                )
        authorizer = self.get("authorizer.class.name")
        if authorizer == _ZOOKEEPER_AUTHORIZER:
            raise ConfigException(
                f"authorizer.class.name={authorizer} is ZooKeeper mode's authorizer, which KRaft does not have: "
                f"use authorizer.class.name={STANDARD_AUTHORIZER}"
            )
        if authorizer and authorizer != STANDARD_AUTHORIZER:
            raise ConfigException(
                f"authorizer.class.name={authorizer}: tierlog's only authorizer is {STANDARD_AUTHORIZER}"
            )
        if "security.inter.broker.protocol" in self.originals and self.get("inter.broker.listener.name"):
            raise ConfigException(
                "Only one of inter.broker.listener.name and security.inter.broker.protocol should be set."
            )

    def _check_sasl(self) -> None:
        """Every SASL listener can authenticate with what is configured (Kafka finds most of this out when it
        builds the listener's channel, which fails its start-up too), and so can this broker with other brokers
        and the controller. docs/security.md#sasl."""
        protocols = self.listener_security_protocols
        for listener in map(parse_listener, self.get_list("listeners")):
            if protocols.get(listener.name) not in SASL_PROTOCOLS:
                continue
            for mechanism in self.sasl_enabled_mechanisms(listener.name):
                module = self.sasl_jaas_config(listener.name, mechanism)
                if mechanism == PLAIN and module is None:
                    raise ConfigException(
                        f"listener {listener.name} enables SASL mechanism PLAIN but has no users: set "
                        f'{_jaas_key(listener.name, PLAIN)}={PLAIN_LOGIN_MODULE} required user_<name>="<password>" ...;'
                    )
        # A dedicated controller has no inter-broker listener: it connects only to other controllers.
        inter_broker = None if self.is_dedicated_controller else self.inter_broker_listener_name
        for purpose, listener_name, mechanism_config in (
            ("inter-broker", inter_broker, "sasl.mechanism.inter.broker.protocol"),
            ("controller", self.controller_listener_name, "sasl.mechanism.controller.protocol"),
        ):
            if listener_name is None or protocols.get(listener_name) not in SASL_PROTOCOLS:
                continue
            mechanism = self.get(mechanism_config)
            if mechanism not in SUPPORTED_MECHANISMS:
                raise ConfigException(
                    f"{mechanism_config}={mechanism}, but the {purpose} listener {listener_name} uses SASL and "
                    f"tierlog supports only {', '.join(SUPPORTED_MECHANISMS)}: set {mechanism_config}=PLAIN"
                )
            if mechanism not in self.sasl_enabled_mechanisms(listener_name):
                raise ConfigException(
                    f"{mechanism_config} must be included in sasl.enabled.mechanisms when SASL is used for "
                    f"{purpose} communication ({mechanism} is not enabled on listener {listener_name})"
                )
            module = self.sasl_jaas_config(listener_name, mechanism)
            if module is None or module.username is None or module.password is None:
                raise ConfigException(
                    f"{_jaas_key(listener_name, mechanism)} needs username and password: this broker's own "
                    f"credentials for {purpose} connections over {mechanism}"
                )

    def sasl_enabled_mechanisms(self, listener_name: str) -> list[str]:
        """The SASL mechanisms of a listener: listener.name.<name>.sasl.enabled.mechanisms, else
        sasl.enabled.mechanisms; ConfigException for none or one tierlog does not implement."""
        key = f"listener.name.{listener_name.lower()}.sasl.enabled.mechanisms"
        if key in self.originals:
            mechanisms = [m.strip() for m in self.originals[key].split(",") if m.strip()]
        else:
            key = "sasl.enabled.mechanisms"
            mechanisms = self.get_list(key)
        if not mechanisms:
            raise ConfigException(f"No SASL mechanisms are enabled on listener {listener_name} ({key} is empty)")
        unsupported = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
        if unsupported:
            raise ConfigException(
                f"{key}={','.join(mechanisms)} for SASL listener {listener_name}: tierlog supports "
                f"{', '.join(SUPPORTED_MECHANISMS)}, not {', '.join(unsupported)} (Kafka's default is GSSAPI): "
                f"set {key}=PLAIN"
            )
        return list(dict.fromkeys(mechanisms))

    def sasl_jaas_config(self, listener_name: str, mechanism: str) -> JaasLoginModule | None:
        """The login module of listener.name.<listener>.<mechanism>.sasl.jaas.config (both in lower case), where
        Kafka's brokers read it; None when it is not set. ConfigException for a value that does not parse or
        names the login module of another mechanism."""
        key = _jaas_key(listener_name, mechanism)
        text = self.originals.get(key)
        if text is None:
            return None
        try:
            module = parse_jaas_config(text)
        except JaasConfigError as e:
            raise invalid(key, "(hidden)", str(e)) from None
        expected = PLAIN_LOGIN_MODULE if mechanism == PLAIN else SCRAM_LOGIN_MODULE
        if module.class_name != expected:
            raise invalid(key, "(hidden)", f"the login module of {mechanism} is {expected}, not {module.class_name}")
        return module

    def inter_broker_client_security(self) -> ClientSecurity:
        """How this broker connects to other brokers' inter-broker listener (replica fetchers, the remote log
        metadata topic): its protocol and, over SASL, sasl.mechanism.inter.broker.protocol with the username and
        password of that listener's JAAS config."""
        return self._client_security(self.inter_broker_listener_name, "sasl.mechanism.inter.broker.protocol")

    def controller_client_security(self) -> ClientSecurity:
        """How this broker connects to the controller's listener (controller.listener.names), over SASL with
        sasl.mechanism.controller.protocol and the username and password of that listener's JAAS config."""
        return self._client_security(self.controller_listener_name, "sasl.mechanism.controller.protocol")

    def _client_security(self, listener_name: str | None, mechanism_config: str) -> ClientSecurity:
        """The security protocol of `listener_name`; over TLS its ssl.* settings (the trust store, and the key
        store as client certificate when there is one); over SASL `mechanism_config` with the username and
        password of that listener's JAAS config."""
        if listener_name is None:
            return ClientSecurity()
        protocol = self.security_protocol_of(listener_name)
        context = None
        if protocol in TLS_PROTOCOLS:
            try:
                context = client_context(self.ssl_settings(listener_name))
            except SslConfigError as e:
                raise ConfigException(f"listener {listener_name} (the broker's own connections): {e}") from None
        if protocol not in SASL_PROTOCOLS:
            return ClientSecurity(protocol, context)
        mechanism = self.get(mechanism_config)
        module = self.sasl_jaas_config(listener_name, mechanism)
        assert module is not None  # _check_sasl: every SASL client listener has its credentials
        return ClientSecurity(protocol, context, mechanism, module.username, module.password)

    @property
    def controller_listener_name(self) -> str | None:
        """The listener brokers reach the controller on: the first of controller.listener.names."""
        names = self.get_list("controller.listener.names")
        return names[0].upper() if names else None

    def _check_quorum(self) -> None:
        voters = self.get_list("controller.quorum.voters")
        voter_ids = set(self.quorum_voters)
        if self.is_controller and voter_ids and self.node_id not in voter_ids:
            raise ConfigException(
                f"If process.roles contains the 'controller' role, the node id {self.node_id} must be included in "
                f"the set of voters controller.quorum.voters={','.join(voters)}"
            )
        if not self.is_controller and self.node_id in voter_ids:
            raise ConfigException(
                f"If process.roles contains just the 'broker' role, the node id {self.node_id} must not be included "
                f"in the set of voters controller.quorum.voters={','.join(voters)}"
            )
        if self.is_dedicated_controller and not voter_ids:
            raise ConfigException(
                "process.roles=controller needs controller.quorum.voters listing this node, e.g. "
                f"controller.quorum.voters={self.node_id}@host:9093"
            )
        if self.is_controller and not voter_ids and self.get_list("controller.quorum.bootstrap.servers"):
            # Kafka forms such a quorum only from voters written at format time (KIP-853's dynamic quorum); each
            # node here would be a one-voter quorum, its own cluster (docs/quorum.md#limits).
            raise ConfigException(
                "A controller needs controller.quorum.voters: controller.quorum.bootstrap.servers alone asks for a "
                "dynamic quorum (KIP-853), which tierlog does not have; list every voter as id@host:port"
            )
        if not self.is_controller and self.is_standalone:
            raise ConfigException(
                "process.roles=broker needs controller.quorum.voters or controller.quorum.bootstrap.servers"
            )

    def _check_listeners(self) -> None:
        protocols = self.listener_security_protocols
        all_listeners = [parse_listener(uri) for uri in self.get_list("listeners")]
        for listener in all_listeners:
            protocol = protocols.get(listener.name)
            if protocol is None:
                raise ConfigException(
                    f"Listener with name {listener.name} defined in listeners not found in "
                    "listener.security.protocol.map."
                )
            if protocol in TLS_PROTOCOLS:
                self._check_tls_listener(listener, protocol)
        if self.is_dedicated_controller:
            self._check_dedicated_controller_listeners(all_listeners)
            return
        if not self.listeners:
            raise ConfigException("listeners has no broker listener: set e.g. listeners=PLAINTEXT://127.0.0.1:9092")
        names = {listener.name for listener in all_listeners}
        if self.is_controller and not self.is_standalone:
            controller_names = {n.upper() for n in self.get_list("controller.listener.names")}
            if not controller_names or not controller_names <= names:
                raise ConfigException(
                    "controller.listener.names must only contain values appearing in the 'listeners' configuration "
                    "when running the KRaft controller role"
                )
        inter_broker = self.get("inter.broker.listener.name").upper()
        if inter_broker and inter_broker not in {listener.name for listener in self.advertised_listeners}:
            raise ConfigException(
                f"inter.broker.listener.name must be a listener name defined in advertised.listeners. The valid "
                f"options based on currently configured listeners are {','.join(sorted(names))}"
            )
        if "security.inter.broker.protocol" in self.originals:
            by_protocol = self.get("security.inter.broker.protocol").upper()
            if by_protocol not in {listener.name for listener in self.advertised_listeners}:
                raise ConfigException(
                    f"security.inter.broker.protocol={by_protocol} names the inter-broker listener {by_protocol}, "
                    f"which advertised.listeners does not have (listeners: {','.join(sorted(names))})"
                )

    def _check_dedicated_controller_listeners(self, all_listeners: list[Listener]) -> None:
        """Kafka's KafkaConfig.validateValues for process.roles=controller: the node serves its controller
        listeners only (docs/configuration.md#dedicated-controllers)."""
        controller_names = {n.upper() for n in self.get_list("controller.listener.names")}
        if not controller_names & {listener.name for listener in all_listeners}:
            raise ConfigException(
                "controller.listener.names must contain at least one value appearing in the 'listeners' "
                "configuration when running the KRaft controller role"
            )
        if any(listener.name not in controller_names for listener in all_listeners):
            raise ConfigException(
                "The listeners config must only contain KRaft controller listeners from controller.listener.names "
                "when process.roles=controller"
            )
        if self.get_list("advertised.listeners"):
            raise ConfigException("The advertised.listeners config must be empty when process.roles=controller")

    def _check_tls_listener(self, listener: Listener, protocol: str) -> None:
        """A TLS listener needs a key store and usable ssl.* settings; files are read when the broker builds
        its contexts (server_ssl_context), so that the check of a config does no I/O."""
        settings = self.ssl_settings(listener.name)
        uri = f"{listener.name}://{listener.host}:{listener.port}"
        if not settings.has_keystore:
            raise ConfigException(
                f"listeners: {uri} uses security protocol {protocol} but has no key store: set "
                f"ssl.keystore.location (a PEM file with the private key and certificate chain), or "
                f"ssl.keystore.certificate.chain and ssl.keystore.key (or their listener.name."
                f"{listener.name.lower()}.ssl.* forms)"
            )
        problem = settings_problem(settings)
        if problem is not None:
            raise ConfigException(f"listeners: {uri}: {problem}")
        prefix = f"listener.name.{listener.name.lower()}."
        for password in _PEM_STORE_PASSWORDS:
            if self.props.get(prefix + password, self.props.get(password)):
                raise ConfigException(
                    f"{password} is set, but PEM stores take no store password (only ssl.key.password, for an "
                    "encrypted private key)"
                )

    # TLS (docs/security.md#tls)

    def ssl_settings(self, listener_name: str) -> SslSettings:
        """The ssl.* settings of a listener: each listener.name.<name>.ssl.* override, else the broker's."""
        prefix = f"listener.name.{listener_name.lower()}."

        def value(name: str) -> object:
            if prefix + name in self.props:
                return parse_config_value(BROKER_CONFIGS[name], self.props[prefix + name])
            return self._values[name]

        def text(name: str) -> str | None:
            found = value(name)
            return None if found is None else str(found)

        return SslSettings(
            keystore_type=str(value("ssl.keystore.type")),
            keystore_location=text("ssl.keystore.location") or None,
            key_password=text("ssl.key.password") or None,
            keystore_certificate_chain=text("ssl.keystore.certificate.chain") or None,
            keystore_key=text("ssl.keystore.key") or None,
            truststore_type=str(value("ssl.truststore.type")),
            truststore_location=text("ssl.truststore.location") or None,
            truststore_certificates=text("ssl.truststore.certificates") or None,
            client_auth=str(value("ssl.client.auth")),
            enabled_protocols=tuple(value("ssl.enabled.protocols")),  # type: ignore[arg-type]
            protocol=str(value("ssl.protocol")),
            cipher_suites=tuple(value("ssl.cipher.suites")),  # type: ignore[arg-type]
            endpoint_identification_algorithm=str(value("ssl.endpoint.identification.algorithm")),
            principal_mapping_rules=str(value("ssl.principal.mapping.rules")),
        )

    def security_protocol_of(self, listener_name: str) -> str:
        return self.listener_security_protocols.get(listener_name.upper(), "PLAINTEXT")

    def server_ssl_context(self, listener_name: str) -> ssl.SSLContext | None:
        """The SSLContext a listener serves with (None for a listener without TLS); the key and trust store
        files are read here, and a file that cannot be used is a ConfigException naming the key and the file."""
        if self.security_protocol_of(listener_name) not in TLS_PROTOCOLS:
            return None
        try:
            return server_context(self.ssl_settings(listener_name))
        except SslConfigError as e:
            raise ConfigException(f"listener {listener_name}: {e}") from None

    @property
    def listener_security_protocols(self) -> dict[str, str]:
        """listener.security.protocol.map as a dict; as in Kafka's KRaft mode, controller listeners missing from
        a map left at its default are PLAINTEXT."""
        protocols = {}
        for entry in self.get("listener.security.protocol.map").split(","):
            name, _, protocol = entry.strip().partition(":")
            protocols[name.strip().upper()] = protocol.strip().upper()
        if "listener.security.protocol.map" not in self.originals:
            for name in self.get_list("controller.listener.names"):
                protocols.setdefault(name.upper(), "PLAINTEXT")
        return protocols

    @property
    def node_id(self) -> int:
        return self.get_int("node.id")

    @property
    def is_controller(self) -> bool:
        return "controller" in self.process_roles

    @property
    def is_dedicated_controller(self) -> bool:
        """process.roles=controller: the node runs the controller alone, on its controller listeners."""
        return self.process_roles == {"controller"}

    @property
    def process_roles(self) -> set[str]:
        return set(self.get_list("process.roles"))

    @property
    def quorum_voters(self) -> dict[int, tuple[str, int]]:
        """controller.quorum.voters: each voter's node id and the address of its controller listener."""
        voters: dict[int, tuple[str, int]] = {}
        for voter in self.get_list("controller.quorum.voters"):
            node_id, _, address = voter.partition("@")
            voters[int(node_id)] = parse_host_port("controller.quorum.voters", address)
        return voters

    @property
    def controller_quorum_servers(self) -> list[tuple[int | None, str, int]]:
        """Where a broker looks for the active controller (docs/quorum.md#active-controller): every
        voter with its node id, or `controller.quorum.bootstrap.servers` (node ids unknown) when that is set."""
        servers = self.get_list("controller.quorum.bootstrap.servers")
        if servers:
            return [(None, *parse_host_port("controller.quorum.bootstrap.servers", s)) for s in servers]
        return [(node_id, host, port) for node_id, (host, port) in self.quorum_voters.items()]

    @property
    def is_standalone(self) -> bool:
        """No controller.quorum.voters nor bootstrap servers: this node is its own controller, the one-broker
        cluster `tierlog broker` starts on embedded defaults."""
        return not self.controller_quorum_servers

    def internal_topic_replication_factor(self, name: str, configured: Mapping[str, str] | None = None) -> int:
        """The replication factor of an internal topic (`offsets.topic.replication.factor`, or an rlmm.config.
        one in `configured`): as set, else 1 on a standalone node (Kafka's single-node server.properties sets
        these to 1, so groups and tiered storage work out of the box) and the Kafka default of 3 otherwise."""
        values = self.originals if configured is None else configured
        if name in values:
            try:
                return int(values[name])
            except ValueError:
                raise invalid(name, values[name], "Not a number of type SHORT") from None
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
        """inter.broker.listener.name; else, when security.inter.broker.protocol is set, the listener named after
        that protocol (Kafka's rule); else the first broker listener."""
        if self.get("inter.broker.listener.name"):
            return self.get("inter.broker.listener.name").upper()
        if "security.inter.broker.protocol" in self.originals:
            return self.get("security.inter.broker.protocol").upper()
        return self.listeners[0].name

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

    @functools.cached_property
    def _advertised_listener_names(self) -> tuple[str, ...]:
        # Worked out once: Metadata and FindCoordinator ask on every request, and advertised.listeners is not a
        # dynamic config (reconfigure cannot change it).
        return tuple(listener.name for listener in self.advertised_listeners)

    def answering_listener_name(self, request_listener: str) -> str:
        """The listener whose endpoints Metadata and FindCoordinator answer with: as in Kafka, the one the
        request came in on (an SSL client is sent to SSL endpoints); the first advertised listener for a request
        made inside the broker or on a listener that is not advertised (the controller's)."""
        names = self._advertised_listener_names
        return request_listener if request_listener in names else names[0]

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
        """Every explicit property, dynamic ones included: LogConfig picks the broker synonyms it knows."""
        return dict(self.props)

    # Dynamic broker configs (Kafka's DynamicBrokerConfig)

    def validate_dynamic(self, configs: Mapping[str, str], *, per_broker: bool) -> None:
        """Kafka's DynamicBrokerConfig.validate for a new set of dynamic configs of this broker (`per_broker`)
        or of the cluster-wide default: only configs tierlog applies while it runs, each valid on its own and
        together with this broker's other settings. ConfigException with Kafka's message otherwise."""
        static = sorted(name for name in configs if name not in DYNAMIC_BROKER_CONFIGS)
        if static:
            raise ConfigException(f"Cannot update these configs dynamically: Set({', '.join(static)})")
        if per_broker:
            KafkaConfig(self.originals, self.dynamic_defaults, configs)
        else:
            KafkaConfig(self.originals, configs, self.dynamic_broker)

    def reconfigure(self, dynamic_defaults: Mapping[str, str], dynamic_broker: Mapping[str, str]) -> set[str]:
        """Take new dynamic layers; returns the names whose value changed. ConfigException (and nothing
        changes) when the layers do not make a valid configuration with this broker's own settings."""
        candidate = KafkaConfig(self.originals, dynamic_defaults, dynamic_broker)
        changed = {name for name in BROKER_CONFIGS if candidate._values[name] != self._values[name]}
        self.dynamic_defaults, self.dynamic_broker = candidate.dynamic_defaults, candidate.dynamic_broker
        self.props, self._values = candidate.props, candidate._values
        return changed

    def _synonyms(self, name: str, *, per_broker: bool) -> list[ConfigSynonym]:
        """Kafka's ConfigHelper.configSynonyms for `name`: each layer in order of precedence, every synonym of
        the name in it, from the first entry of `name` itself on (so log.roll.ms does not list log.roll.hours,
        and a topic's retention.ms is not said to come from log.retention.hours: Kafka's dropWhile)."""
        names = broker_config_synonyms(name)
        layers: list[tuple[Mapping[str, object], int]] = [
            (self.dynamic_broker, SOURCE_DYNAMIC_BROKER_CONFIG),
            (self.dynamic_defaults, SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG),
            (self.originals, SOURCE_STATIC_BROKER_CONFIG),
            (
                {n: render(d.default) for n, d in BROKER_CONFIGS.items() if d.default is not None},
                SOURCE_DEFAULT_CONFIG,
            ),
        ]
        found = [
            ConfigSynonym(synonym, str(layer[synonym]), source)
            for layer, source in layers
            for synonym in names
            if synonym in layer
        ]
        while found and found[0].name != name:
            found.pop(0)
        return [synonym for synonym in found if per_broker or synonym.source == SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG]

    def describe_broker(self, *, per_broker: bool) -> list[DescribedConfig]:
        """DescribeConfigs of this broker (`per_broker`: every config, with its value and where it comes from)
        or of the cluster-wide default (only the dynamic defaults that are set), as Kafka's ConfigHelper."""
        if per_broker:
            names = set(BROKER_CONFIGS) - DYNAMIC_ONLY_BROKER_CONFIGS
            names |= set(self.originals) | set(self.dynamic_defaults) | set(self.dynamic_broker)
        else:
            names = set(self.dynamic_defaults)
        described = []
        for name in sorted(names):
            synonyms = self._synonyms(name, per_broker=per_broker)
            definition = BROKER_CONFIGS.get(name)
            if not per_broker:
                value: str | None = self.dynamic_defaults[name]
            elif definition is not None:
                value = None if self._values[name] is None else self.get(name)
            else:
                value = self.originals[name]
            sensitive = _is_password(name)
            if sensitive:
                value = None
                synonyms = [ConfigSynonym(synonym.name, None, synonym.source) for synonym in synonyms]
            described.append(
                DescribedConfig(
                    name=name,
                    value=value,
                    source=synonyms[0].source if synonyms else SOURCE_DEFAULT_CONFIG,
                    read_only=name not in DYNAMIC_BROKER_CONFIGS,
                    synonyms=tuple(synonyms),
                    type=definition.type if definition is not None else None,
                    doc=definition.doc if definition is not None else None,
                    sensitive=sensitive,
                )
            )
        return described

    def describe_topic(self, overrides: Mapping[str, str]) -> list[DescribedConfig]:
        """DescribeConfigs of a topic with `overrides`: every topic config's effective value, sourced from the
        override, else the broker synonyms in their order of precedence, as Kafka's createTopicConfigEntry."""
        effective = LogConfig.from_props(overrides, self.props)
        described = []
        for name, definition in sorted(ALL_TOPIC_CONFIGS.items()):
            synonyms: list[ConfigSynonym] = []
            if name in overrides:
                synonyms.append(ConfigSynonym(name, overrides[name], SOURCE_TOPIC_CONFIG))
            if definition.broker_synonym is not None:
                synonyms += self._synonyms(definition.broker_synonym, per_broker=True)
            if name in TOPIC_CONFIGS:
                value = render(getattr(effective, name.replace(".", "_")))
            else:
                value = synonyms[0].value if synonyms else render(definition.default)
            described.append(
                DescribedConfig(
                    name=name,
                    value=value,
                    source=synonyms[0].source if synonyms else SOURCE_DEFAULT_CONFIG,
                    read_only=False,
                    synonyms=tuple(synonyms),
                    type=definition.type,
                    doc=definition.doc,
                )
            )
        return described
