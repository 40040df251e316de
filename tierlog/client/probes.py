"""Is a Kafka broker answering at an address? Asked with requests every Kafka broker answers (ApiVersions v0,
Metadata v1), on a blocking socket: it works before any client library could connect, and librdkafka would
cache and retry where a probe must see the broker as it is now.

Over TLS (security.protocol SSL or SASL_SSL) the socket is wrapped in the ClientSecurity's context first.
ApiVersions needs no authentication on any listener (Kafka answers it before SaslHandshake); Metadata does on
a SASL listener, which these blocking probes do not authenticate to: they ask such a broker on a PLAINTEXT or
SSL listener instead (a secured local cluster's inter-broker one). Rules: docs/security.md#tools."""

from __future__ import annotations

import socket

from tierlog.client.connection import KafkaConnectionError, send_blocking
from tierlog.client.requests import api_versions_request, describe_quorum_request, metadata_request
from tierlog.client.security import PLAINTEXT, ClientSecurity
from tierlog.protocol.errors import error_code
from tierlog.raft.raft_log import METADATA_TOPIC

PROBE_CLIENT_ID = "tierlog-probe"


def connect_blocking(host: str, port: int, timeout_s: float, security: ClientSecurity = PLAINTEXT) -> socket.socket:
    """A blocking socket connected to `host:port`, each operation bounded by `timeout_s`, with the TLS
    handshake done when `security` uses TLS (the server's certificate checked for `host`). Raises OSError
    (ssl.SSLError for a failed handshake)."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    if not security.uses_tls or security.ssl_context is None:
        return sock
    try:
        return security.ssl_context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def api_versions_answered(host: str, port: int, timeout_s: float, security: ClientSecurity = PLAINTEXT) -> bool:
    """True when `host:port` answers a Kafka ApiVersions v0 request without error within `timeout_s` (to
    connect, then for each socket operation)."""
    try:
        with connect_blocking(host, port, timeout_s, security) as sock:
            return answers_api_versions(sock)
    except OSError:
        return False


def answers_api_versions(sock: socket.socket) -> bool:
    """True when the peer of the connected `sock` answers ApiVersions v0 without error, within the socket's
    timeout (as `api_versions_answered`, for a caller that made the connection itself)."""
    try:
        response = send_blocking(sock, api_versions_request(), client_id=PROBE_CLIENT_ID)
    except KafkaConnectionError:
        return False
    return bool(response.error_code == error_code(None))


def metadata_broker_ids(
    host: str, port: int, timeout_s: float, security: ClientSecurity = PLAINTEXT
) -> set[int] | None:
    """The node ids a Metadata answer from `host:port` lists (fenced brokers are left out), or None when it
    does not answer in time. ValueError for a SASL `security`: Metadata would need authentication."""
    if security.uses_sasl:
        raise ValueError(f"a Metadata probe cannot authenticate ({security.protocol}): ask a PLAINTEXT or SSL listener")
    try:
        with connect_blocking(host, port, timeout_s, security) as sock:
            response = send_blocking(sock, metadata_request(()), client_id=PROBE_CLIENT_ID)
    except (OSError, KafkaConnectionError):
        return None
    return {int(broker.node_id) for broker in response.brokers}


def quorum_leadership(host: str, port: int, timeout_s: float) -> tuple[int, int] | None:
    """(leader id, epoch) when the voter at `host:port` (its controller listener, PLAINTEXT) leads the controller
    quorum and says so in a DescribeQuorum v0 answer within `timeout_s`; None when it does not lead
    (NOT_LEADER_OR_FOLLOWER) or does not answer."""
    try:
        request = describe_quorum_request(METADATA_TOPIC, version=0)
        with connect_blocking(host, port, timeout_s) as sock:
            response = send_blocking(sock, request, client_id=PROBE_CLIENT_ID)
    except (OSError, KafkaConnectionError):
        return None
    if response.error_code != error_code(None):
        return None
    for topic in response.topics:
        for partition in topic.partitions:
            if partition.error_code == error_code(None) and partition.leader_id >= 0:
                return int(partition.leader_id), int(partition.leader_epoch)
    return None
