"""Is a Kafka broker answering at an address? Asked with requests every Kafka broker answers (ApiVersions v0,
Metadata v1), on a blocking socket: it works before any client library could connect, and librdkafka would
cache and retry where a probe must see the broker as it is now."""

from __future__ import annotations

import socket

from tierlog.client.connection import KafkaConnectionError, send_blocking
from tierlog.client.requests import api_versions_request, metadata_request
from tierlog.protocol.errors import error_code

PROBE_CLIENT_ID = "tierlog-probe"


def api_versions_answered(host: str, port: int, timeout_s: float) -> bool:
    """True when `host:port` answers a Kafka ApiVersions v0 request without error within `timeout_s` (to
    connect, then for each socket operation)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
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


def metadata_broker_ids(host: str, port: int, timeout_s: float) -> set[int] | None:
    """The node ids a Metadata answer from `host:port` lists (fenced brokers are left out), or None when it
    does not answer in time."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            response = send_blocking(sock, metadata_request(()), client_id=PROBE_CLIENT_ID)
    except (OSError, KafkaConnectionError):
        return None
    return {int(broker.node_id) for broker in response.brokers}
