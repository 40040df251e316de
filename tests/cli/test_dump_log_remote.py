"""`tierlog dump-log --files` reads a tiered topic's objects under their names in the remote tier
(<base offset>-<segment id>.log, .index, .timeindex, .snapshot, .leader_epoch_checkpoint), as a broker with a
file:// remote tier leaves them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from cli_helpers import tierlog

from tierlog.testing.local_cluster import BrokerProcess, wait_until

TIERING_S = 60.0
RECORDS = 400  # of about 110 bytes: three 16 KiB segments, two of them closed and copied


def test_dumps_a_tiered_topics_objects_by_their_remote_names(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    broker = broker_factory(
        {
            "remote.log.storage.system.enable": "true",
            "rsm.config.url": f"file://{remote}",
            "remote.log.manager.task.interval.ms": "200",
            "log.retention.check.interval.ms": "200",
            "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
            "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        }
    )
    configs = ["remote.storage.enable=true", "segment.bytes=16384", "local.retention.bytes=1"]
    created = tierlog(
        "topic", "create", "tiered", "-p", "1", *(a for c in configs for a in ("-c", c)), "-b", broker.bootstrap
    )
    assert created.code == 0, created.stderr
    lines = b"".join(b"record-%06d-" % i + b"v" * 100 + b"\n" for i in range(RECORDS))
    # An idempotent producer, so the copied producer snapshots have a producer in them, and batches well
    # below the segment size, which the broker refuses a batch to exceed.
    settings = ["-X", "enable.idempotence=true", "-X", "batch.size=4000"]
    produced = tierlog("produce", "tiered", *settings, "-b", broker.bootstrap, stdin=lines)
    assert produced.code == 0, produced.stderr

    wait_until(lambda: len(list(remote.rglob("*.log"))) >= 2, TIERING_S, "two segments copied to the remote tier")
    second = sorted(remote.rglob("*.log"))[1]
    assert re.fullmatch(r"\d{20}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.log", second.name)
    base_offset = int(second.name[:20])
    assert base_offset > 0
    objects = [second.with_suffix(suffix) for suffix in (".log", ".index", ".timeindex", ".snapshot")]
    objects.append(second.with_suffix(".leader_epoch_checkpoint"))

    dumped = tierlog("dump-log", "--print-data-log", *(arg for path in objects for arg in ("--files", str(path))))
    assert dumped.code == 0, dumped.stderr
    assert dumped.first_line == f"Dumping {second}"
    sections = dict(zip(objects, re.split(r"^Dumping .*\n", dumped.stdout, flags=re.MULTILINE)[1:], strict=True))

    log, index, time_index, snapshot, epochs = (sections[path].splitlines() for path in objects)
    assert log[0] == f"Log starting offset: {base_offset}"
    assert log[1].startswith(f"baseOffset: {base_offset} ")
    assert re.search(r"producerId: \d+ producerEpoch: 0 ", log[1]), log[1]
    assert f"| offset: {base_offset} " in log[2] and f"payload: record-{base_offset:06d}-vvv" in log[2]
    assert index and all(re.fullmatch(r"offset: \d+ position: \d+", line) for line in index), index
    assert int(index[0].split()[1]) >= base_offset
    assert time_index and all(re.fullmatch(r"timestamp: \d+ offset: \d+", line) for line in time_index)
    assert len(snapshot) == 1 and re.match(r"producerId: \d+ producerEpoch: 0 ", snapshot[0]), snapshot
    assert epochs == ["epoch: 0 startOffset: 0"]
