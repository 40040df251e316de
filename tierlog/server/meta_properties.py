"""`meta.properties`: the identity a log directory belongs to (KRaft's version 1 format)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

from tierlog.config import parse_properties
from tierlog.config_def import ConfigException
from tierlog.storage.checkpoints import atomic_write_text, kafka_uuid_to_str

META_PROPERTIES = "meta.properties"


def cluster_id_on_disk(log_dirs: Sequence[Path]) -> str:
    """The cluster id an earlier run wrote to meta.properties, or "" for fresh directories."""
    for log_dir in log_dirs:
        path = log_dir / META_PROPERTIES
        if path.exists():
            return parse_properties(path.read_text()).get("cluster.id", "")
    return ""


def ensure_meta_properties(log_dir: Path, node_id: int, cluster_id: str) -> None:
    """Write meta.properties on first use; afterwards refuse to start a different node on the directory,
    as Kafka does, so two brokers never share (and corrupt) one log dir."""
    path = log_dir / META_PROPERTIES
    if path.exists():
        props = parse_properties(path.read_text())
        if props.get("node.id") != str(node_id):
            raise ConfigException(
                f"{path} belongs to node.id {props.get('node.id')}, but this broker is node.id {node_id}"
            )
        if props.get("cluster.id") not in (None, cluster_id):
            raise ConfigException(
                f"{path} belongs to cluster {props.get('cluster.id')}, but the metadata says {cluster_id}"
            )
        return
    text = f"#\nnode.id={node_id}\ndirectory.id={kafka_uuid_to_str(uuid.uuid4())}\nversion=1\ncluster.id={cluster_id}\n"
    atomic_write_text(path, text)
