"""One local SparkSession for the whole test session (a JVM start costs ~20 s), with tierlog registered.

The broker and S3 fixtures (`broker`, `shared_broker`, `cluster_factory`, `s3_server`, `kafka`, ...) come from
tests/conftest.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tierlog.spark.source import TierlogDataSource


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Python workers must run this interpreter (the venv with tierlog), and the driver must bind to the
    # loopback address the brokers listen on instead of whatever the host name resolves to.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Workers import tierlog from the worktree under test, not from wherever the venv points.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tierlog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.dataSource.register(TierlogDataSource)
    try:
        yield session
    finally:
        session.stop()
