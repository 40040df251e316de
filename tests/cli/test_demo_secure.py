"""`tierlog demo --secure`: the whole demo with every client (producer, consumer, admin, Spark's source) on
the cluster's SASL_SSL listener, the brokers talking to each other on PLAINTEXT bound to 127.0.0.1. Needs the
brokers' TLS (branch sec-tls) and SASL/PLAIN (branch sec-sasl)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierlog.config import parse_properties

pytestmark = pytest.mark.cluster


def test_secure_demo_runs_every_client_over_sasl_ssl(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "demo", "--secure", "--events", "2000", "--data-dir", str(data_dir)],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    flat = " ".join(result.stdout.split())
    assert "clients: SASL_SSL with SASL/PLAIN, user admin" in flat
    assert f"kcat -F FILE): {data_dir / 'security' / 'client.properties'}" in flat
    assert "brokers talk to each other unencrypted and unauthenticated on PLAINTEXT" in flat
    assert "2,000 events acknowledged" in flat
    assert "2,000 events read back and verified" in flat
    assert "2,000 events, each exactly once" in flat
    settings = parse_properties((data_dir / "security" / "client.properties").read_text())
    assert settings["security.protocol"] == "SASL_SSL"
