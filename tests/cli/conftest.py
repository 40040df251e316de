"""Fixtures of the CLI tests (the helpers they share are in cli_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import CliCluster, log_tails


@pytest.fixture
def cli_cluster(tmp_path: Path) -> Iterator[CliCluster]:
    """A cluster the test starts with `tierlog cluster up`; whatever it left running is killed afterwards and
    the brokers' log tails are printed."""
    cluster = CliCluster(tmp_path / "cluster")
    try:
        yield cluster
    finally:
        cluster.kill_leftovers()
        log_tails(sorted(cluster.log_files))
