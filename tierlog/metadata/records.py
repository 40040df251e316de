"""The records of the metadata log: one frozen dataclass per KRaft record type, with KRaft's field names.

A record is stored as the value of an ordinary Kafka record: a compact JSON object whose "type" names the
dataclass, so `tierlog dump-log` can show the metadata log and any JSON tool can read it. Bytes are base64.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeAlias, get_args


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A listener a broker advertises: the listener name, and where clients reach it."""

    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class ClusterIdRecord:
    cluster_id: str


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord:
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool


@dataclass(frozen=True, slots=True)
class BrokerRegistrationChangeRecord:
    """None in `fenced` or `in_controlled_shutdown` leaves that flag as it is."""

    broker_id: int
    broker_epoch: int
    fenced: bool | None
    in_controlled_shutdown: bool | None


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRecord:
    """The broker's registration of this epoch is gone (KIP-500's decommissioning; docs/reassignment.md#unregister)."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """The whole state of a partition after a change (KRaft splits creation and change; one form is enough
    while nobody needs the delta)."""

    topic_id: uuid.UUID
    partition_id: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    # A reassignment in progress (KIP-455; docs/reassignment.md): `replicas` is the target followed by the
    # replicas being removed, `adding_replicas` the targets not yet in the old assignment. Empty otherwise, and
    # in records written before reassignments existed.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


# Kafka's ConfigResource.Type ids, as ConfigRecord and the admin APIs carry them.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    """A config override of a topic, or a dynamic broker config (`resource_name` a broker id, or "" for the
    cluster-wide default); a None value removes it."""

    resource_name: str
    name: str
    value: str | None
    # Last, with a default: records written before broker configs existed are topic configs.
    resource_type: int = RESOURCE_TOPIC


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    topic_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class ProducerIdsRecord:
    """`broker_id` took the block that ends at `next_producer_id`, the start of the next block."""

    broker_id: int
    next_producer_id: int


# Kafka's ScramMechanism type ids, as UserScramCredentialRecord and the SCRAM admin APIs carry them.
SCRAM_MECHANISM_NAMES: dict[int, str] = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}


@dataclass(frozen=True, slots=True)
class UserScramCredentialRecord:
    """A user's SCRAM credential for one mechanism (a SCRAM_MECHANISM_NAMES id), replacing any it had: never
    the password, only what RFC 5802 has a server keep."""

    name: str
    mechanism: int
    # Out of reprs, as Kafka hides them in logs: enough to impersonate the server to a client of this user.
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int


@dataclass(frozen=True, slots=True)
class RemoveUserScramCredentialRecord:
    name: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class AccessControlEntryRecord:
    """An ACL (Kafka's record of that name): the codes are Kafka's ResourceType, PatternType, AclOperation and
    AclPermissionType (tierlog/security/acl.py); `principal` is "User:alice" or "User:*", `host` an address or
    "*"."""

    id: uuid.UUID
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


@dataclass(frozen=True, slots=True)
class RemoveAccessControlEntryRecord:
    id: uuid.UUID


MetadataRecord: TypeAlias = (
    ClusterIdRecord
    | RegisterBrokerRecord
    | BrokerRegistrationChangeRecord
    | UnregisterBrokerRecord
    | TopicRecord
    | PartitionRecord
    | ConfigRecord
    | RemoveTopicRecord
    | ProducerIdsRecord
    | UserScramCredentialRecord
    | RemoveUserScramCredentialRecord
    | AccessControlEntryRecord
    | RemoveAccessControlEntryRecord
)

# The union is the one list of record types: a type added to it is encoded and decoded with no other change.
_RECORD_TYPES: tuple[type[MetadataRecord], ...] = get_args(MetadataRecord)


def encode_record(record: MetadataRecord) -> bytes:
    document: dict[str, Any] = {"type": type(record).__name__}
    for f in fields(record):
        document[f.name] = _to_json(getattr(record, f.name))
    return json.dumps(document, separators=(",", ":")).encode()


def _to_json(value: object) -> object:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Endpoint):
        return {"name": value.name, "host": value.host, "port": value.port}
    if isinstance(value, tuple):
        return [_to_json(item) for item in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def decode_record(data: bytes) -> MetadataRecord:
    """The record `encode_record` wrote; ValueError naming what is wrong for anything else."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"metadata record is not JSON: {e}") from None
    if not isinstance(document, dict):
        raise ValueError(f"metadata record is not a JSON object: {data[:100]!r}")
    record_type = document.get("type")
    decoders = _DECODERS.get(record_type) if isinstance(record_type, str) else None
    if decoders is None:
        raise ValueError(f"unknown metadata record type {record_type!r}")
    cls, field_decoders = decoders
    values = {}
    for name, decode in field_decoders:
        if name not in document:
            if name in _DEFAULTED_FIELDS.get(record_type, ()):
                continue
            raise ValueError(f"{record_type} lacks field {name!r}")
        try:
            values[name] = decode(document[name])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{record_type}.{name}: {e}") from None
    return cls(**values)


def _int(value: object) -> int:
    # bool is an int in Python, but never a valid id, epoch or offset.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _optional(decode: Callable[[object], Any]) -> Callable[[object], Any]:
    return lambda value: None if value is None else decode(value)


def _uuid(value: object) -> uuid.UUID:
    return uuid.UUID(_str(value))


def _bytes(value: object) -> bytes:
    try:
        return base64.b64decode(_str(value), validate=True)
    except binascii.Error:
        raise ValueError(f"expected base64, got {value!r}") from None


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


def _int_tuple(value: object) -> tuple[int, ...]:
    return tuple(_int(item) for item in _list(value))


def _endpoint(value: object) -> Endpoint:
    if not isinstance(value, dict) or set(value) != {"name", "host", "port"}:
        raise TypeError(f"expected an endpoint {{name, host, port}}, got {value!r}")
    return Endpoint(_str(value["name"]), _str(value["host"]), _int(value["port"]))


def _endpoint_tuple(value: object) -> tuple[Endpoint, ...]:
    return tuple(_endpoint(item) for item in _list(value))


# By annotation: a record field of a type missing here fails at import, not when a broker reads it.
_VALUE_DECODERS: dict[str, Callable[[object], Any]] = {
    "int": _int,
    "str": _str,
    "bool": _bool,
    "bytes": _bytes,
    "str | None": _optional(_str),
    "bool | None": _optional(_bool),
    "uuid.UUID": _uuid,
    "tuple[int, ...]": _int_tuple,
    "tuple[Endpoint, ...]": _endpoint_tuple,
}

_DECODERS: dict[str, tuple[type[MetadataRecord], list[tuple[str, Callable[[object], Any]]]]] = {
    cls.__name__: (cls, [(f.name, _VALUE_DECODERS[str(f.type)]) for f in fields(cls)]) for cls in _RECORD_TYPES
}

# Fields added after records of their type were first written: a record without one takes the default.
_DEFAULTED_FIELDS: dict[str, frozenset[str]] = {
    cls.__name__: frozenset(f.name for f in fields(cls) if f.default is not MISSING) for cls in _RECORD_TYPES
}
