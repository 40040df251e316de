"""The clusters of the tiered-storage tests: three brokers with the remote tier on and every timer short
(`tiered_overrides`), the remote tier a directory of the test's own or a prefix of its own in conftest's
`s3_server`. The brokers come from conftest's `cluster_factory`, so they are stopped when the test ends."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from cluster_helpers import ClusterFactory
from tiered_helpers import tiered_overrides

from tierlog.testing.local_cluster import LocalCluster
from tierlog.testing.local_s3 import LocalS3Server


@pytest.fixture
def remote_dir(tmp_path: Path) -> Path:
    """Where `file_tiered_cluster` keeps its remote tier."""
    return tmp_path / "remote"


@pytest.fixture
def file_tiered_cluster(cluster_factory: ClusterFactory, remote_dir: Path) -> LocalCluster:
    return cluster_factory(tiered_overrides({"rsm.config.url": f"file://{remote_dir}"}))


@pytest.fixture
def s3_prefix() -> str:
    """Where `s3_tiered_cluster` keeps its remote tier in the shared bucket."""
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3_tiered_cluster(
    cluster_factory: ClusterFactory, s3_server: LocalS3Server, s3_bucket: str, s3_prefix: str
) -> LocalCluster:
    return cluster_factory(tiered_overrides(s3_server.rsm_properties(s3_bucket, prefix=s3_prefix)))
