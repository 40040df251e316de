"""Fixtures for the tiered-storage tests: a real S3 server (SeaweedFS `weed mini`) on 127.0.0.1, and
`start_cluster(overrides, brokers=3)` for clusters of real broker processes.

`s3_server` is started once per test module (about a second) with the bucket `S3_TEST_BUCKET` created.
Tests share it, so each works under a prefix of its own (`s3_server.rsm_properties(S3_TEST_BUCKET,
prefix=...)`), and a test that kills or stops it restarts it before it ends (in a `finally`), so the next
test finds it serving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tierlog.testing.local_cluster import LocalCluster
from tierlog.testing.local_s3 import LocalS3Server

S3_TEST_BUCKET = "tierlog-test"
S3_START_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """A started LocalS3Server with the bucket `tierlog-test`, stopped (and its process group gone) when the
    module's last test is done, pass or fail; the tail of its log is printed at teardown."""
    server = LocalS3Server(tmp_path_factory.mktemp("s3"))
    try:
        server.start(timeout_s=S3_START_TIMEOUT_S)
        server.create_bucket(S3_TEST_BUCKET)
        yield server
    finally:
        try:
            server.stop()
        finally:
            print(f"\n---- last lines of {server.log_file} ----\n{server.log_tail(40)}")


@pytest.fixture(scope="module")
def s3_bucket(s3_server: LocalS3Server) -> str:
    """The name of the bucket `s3_server` was started with (test files do not import conftest)."""
    return S3_TEST_BUCKET


CLUSTER_START_S = 60.0


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """`start_cluster(overrides, brokers=3)`: started brokers, stopped when the test ends (their log tails printed)."""
    clusters: list[LocalCluster] = []

    def start(overrides: Mapping[str, str], brokers: int = 3) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster-{len(clusters) + 1}", brokers=brokers, overrides=overrides)
        clusters.append(cluster)
        cluster.start(CLUSTER_START_S)
        return cluster

    try:
        yield start
    finally:
        for cluster in clusters:
            try:
                cluster.stop(timeout_s=10)
            finally:
                for node_id in cluster.node_ids:
                    broker = cluster.broker(node_id)
                    print(f"\n---- last lines of {broker.log_file} ----\n{broker.log_tail(60)}")
