"""`tierlog demo`, the README's main command, exactly as `make demo` runs it: a real S3 server, three real
brokers with tiered storage on it, real clients."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tierlog.cli.main import cli

pytestmark = pytest.mark.cluster

# partition, leader, in S3 (Rx..Ry), on disk (Lx..Lz), HW, objects, S3 bytes, disk bytes
TIER_ROW = re.compile(
    r"^\s*(\d)\s+([123])\s+0\.\.(\d+)\s+(\d+)\.\.(\d+)\s+(\d+)\s+(\d+)\s+([\d,]+)\s+([\d,]+)\s*$", re.M
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_fits_80_columns(output: str) -> None:
    """Everything the demo printed fits an 80-column terminal, and nothing was cut short with an ellipsis."""
    too_wide = [line for line in output.splitlines() if len(line) > 80]
    assert not too_wide and "\u2026" not in output, output


def test_demo_runs_end_to_end_and_cleans_up(tmp_path: Path) -> None:
    # The demo's temporary directory lands in TMPDIR, so this test can see it was removed.
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "80"}
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert_fits_80_columns(out)
    # Sentences wrap at 80 columns: they are looked for with the line breaks taken out.
    flat = " ".join(out.split())
    assert re.search(r"S3 server \(SeaweedFS, pid \d+\) serves http://127\.0\.0\.1:\d+", flat), out
    assert "remote tier: s3://tierlog-demo/tierlog at http://127.0.0.1:" in flat
    started = re.search(r"controller quorum: voters 1, 2, 3, active controller node ([123]) \(epoch (\d+)\)", flat)
    assert started, out

    # The active controller was killed with SIGKILL halfway through producing: another voter took over in a
    # later epoch, and the second half, produced after the kill, was acknowledged too.
    killed = re.search(
        r"kill -9 node ([123]), the active controller \(epoch (\d+)\), with ([\d,]+) of the 10,000 events acknowledged",
        flat,
    )
    assert killed and killed.group(1, 2) == started.group(1, 2), out
    assert 2_500 <= int(killed[3].replace(",", "")) <= 5_000, out
    elected = re.search(r"node ([123]) is the active controller now: epoch (\d+) -> (\d+), elected [\d.]+s", flat)
    assert elected and elected[1] != killed[1] and elected[2] == killed[2] and int(elected[3]) > int(killed[2]), out
    after_kill = re.search(r"10,000 events acknowledged in [\d.]+s \([\d,]+/s\), ([\d,]+) of them after the kill", flat)
    assert after_kill and int(after_kill[1].replace(",", "")) == 10_000 - int(killed[3].replace(",", "")), out
    assert re.search(rf"voter {killed[1]} caught up with the metadata log \(offset \d+\)", flat), out

    # Closed segments went to S3 and left every broker's disk.
    tiered = re.search(
        r"(\d+) closed segments \(([\d,]+) events\) copied to s3://tierlog-demo/tierlog and deleted", flat
    )
    assert tiered, out
    segments, tiered_events = int(tiered[1]), int(tiered[2].replace(",", ""))
    assert segments >= 3 and tiered_events > 5_000, out

    # The two tiers, per partition: S3 holds 0..Ry, the leader's disk Ry+1..HW-1, and S3 most of the bytes.
    rows = TIER_ROW.findall(out)
    assert sorted(int(row[0]) for row in rows) == [0, 1, 2], out
    high_watermarks = 0
    for _, _, remote_end, local_start, local_end, hw, objects, s3_bytes, disk_bytes in rows:
        assert int(local_start) == int(remote_end) + 1 and int(local_end) == int(hw) - 1, out
        # .log, .index, .timeindex, .leader_epoch_checkpoint and the producer .snapshot per segment; the controller
        # killed while producing is a broker too, and may leave the first objects of a copy it had started and
        # never committed (Kafka's COPY_SEGMENT_STARTED), which the bucket still lists.
        assert int(objects) >= 5, out
        assert int(s3_bytes.replace(",", "")) > int(disk_bytes.replace(",", "")) > 0, out
        high_watermarks += int(hw)
    assert high_watermarks == 10_000
    assert sum(int(row[2]) + 1 for row in rows) == tiered_events
    objects_in_s3 = re.search(rf"S3 holds {tiered_events:,} of the 10,000 events in (\d+) objects", flat)
    assert objects_in_s3 and 5 * segments <= int(objects_in_s3[1]) < 5 * segments + 5 * 3, out

    # A leader was killed with SIGKILL before consuming: every event came back from the survivors, the older
    # ones from S3 through the leaders.
    assert re.search(r"kill -9 broker [123], leader of demo-events-\d", flat), out
    assert re.search(r"demo-events-\d: leader [123] -> \d, ISR", flat), out
    assert "10,000 events read back and verified" in flat
    assert f"{tiered_events:,} of them from S3" in flat, out
    assert "is back in every ISR" in flat

    # The first segment object of partition 0, downloaded from the bucket: Kafka's format, the producer's lz4.
    # Its key is longer than a line: its directory on one, its name on the next.
    assert re.search(r"^  s3://tierlog-demo/tierlog/demo-events-0-[^/]+/\n  00000000000000000000-\S+\.log$", out, re.M)
    assert "baseOffset: 0" in out
    # librdkafka sends a batch uncompressed when lz4 would not shrink it: a first batch of one small event,
    # which a loaded machine's linger can produce. Either way it is the producer's choice, kept as is.
    assert re.search(r"compresscodec: (lz4|none) ", out), out

    assert "3 brokers shut down cleanly (wrote .kafka_cleanshutdown)" in flat
    assert "S3 server stopped" in flat
    assert "demo finished" in flat
    assert not list(tmp_path.glob("tierlog-demo-*"))
    assert not list(tmp_path.glob("tierlog-s3-*"))  # weed's temporary directory, when the data path is long
    pids = [int(pid) for pid in re.findall(r"\bpid (\d+)\b", flat)]
    assert len(pids) == 4, out  # the S3 server and three brokers
    assert not [pid for pid in pids if _alive(pid)]


def test_demo_keeps_a_given_data_dir_which_dump_log_reads(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "demo", "--events", "500", "--data-dir", str(data_dir)],
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert_fits_80_columns(result.stdout)
    # 500 events fill no 16 KiB segment: nothing to tier, and the demo says so rather than wait.
    assert "no segment of demo-events-0 in S3 yet" in " ".join(result.stdout.split())
    assert sorted(p.name for p in (data_dir / "broker-1").glob("demo-events-*")) == [
        "demo-events-0",
        "demo-events-1",
        "demo-events-2",
    ]
    assert (data_dir / "broker-1.log").exists()
    assert (data_dir / "s3" / "weed.log").exists()

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
