"""`tierlog demo`, the README's main command, exactly as `make demo` runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tierlog.cli.main import cli


def test_demo_runs_end_to_end_and_cleans_up(tmp_path: Path) -> None:
    # The demo's temporary directory lands in TMPDIR, so this test can see it was removed.
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "10,000 events acknowledged" in out
    assert "10,000 events read back and verified" in out
    # A leader was killed with SIGKILL between produce and consume: the events came back from the survivors.
    assert re.search(r"kill -9 broker [23], leader of demo-events-\d", out), out
    assert re.search(r"demo-events-\d: leader [23] -> \d, ISR", out), out
    assert "is back in every ISR" in out
    assert "3 brokers shut down cleanly (wrote .kafka_cleanshutdown)" in out
    # The summary reads the segment files: every partition holds the producer's lz4 batches as sent
    # (librdkafka sends a batch uncompressed when lz4 would not make it smaller, hence "lz4, none").
    for partition in range(3):
        row = rf"^\s*{partition}\s+[\d,]+\s+0-\d+\s+\d+\s+\d+\s+lz4(, none)?\s"
        assert re.search(row, out, re.MULTILINE), out
    assert "baseOffset: 0" in out  # the dump-log excerpt
    assert "demo finished" in out
    assert not list(tmp_path.glob("tierlog-demo-*"))


def test_demo_keeps_a_given_data_dir_which_dump_log_reads(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "demo", "--events", "500", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in (data_dir / "broker-1").glob("demo-events-*")) == [
        "demo-events-0",
        "demo-events-1",
        "demo-events-2",
    ]
    assert (data_dir / "broker-1.log").exists()

    segment = data_dir / "broker-1" / "demo-events-0" / "00000000000000000000.log"
    index = segment.with_suffix(".index")
    dumped = CliRunner().invoke(cli, ["dump-log", "--files", str(segment), "--files", str(index), "--print-data-log"])
    assert dumped.exit_code == 0, dumped.output
    assert f"Dumping {segment}\nLog starting offset: 0\nbaseOffset: 0 " in dumped.stdout
    assert re.search(
        r"^\| offset: 0 CreateTime: \d+ keySize: 8 .* headerKeys: \[source,event-id\] key: user-", dumped.stdout, re.M
    )
    assert f"Dumping {index}\n" in dumped.stdout

    missing = CliRunner().invoke(cli, ["dump-log", "--files", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2
    assert "does not exist" in missing.stderr
