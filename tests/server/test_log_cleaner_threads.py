"""The cleaner's shell: a clean runs off the event loop and is swapped in on it, unless the log changed or the
broker is stopping meanwhile; its counters show on /metrics; bad cleaner settings are one-line errors."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.config_def import ConfigException
from tierlog.records.codec import build_batch
from tierlog.server import log_cleaner_threads
from tierlog.server.log_cleaner_threads import LogCleanerThreads
from tierlog.storage.log import Log
from tierlog.storage.log_manager import LogManager

T0 = 1_700_000_000_000
TP = TopicPartition("compacted", 0)
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"}


def dirty_log(tmp_path: Path) -> tuple[LogManager, Log]:
    manager = LogManager([tmp_path], {})
    manager.startup({}, T0)
    log = manager.get_or_create_log(TP, uuid.UUID(int=1), COMPACTED, T0)
    for n in range(60):
        batch = build_batch([(f"key-{n % 3}".encode(), f"v{n}".encode(), [], T0)])
        log.append_as_leader(bytearray(batch), 0, T0)
    log.roll(T0)
    log.update_high_watermark(log.log_end_offset)
    return manager, log


def leftovers(log: Log) -> list[str]:
    return [p.name for p in log.dir.iterdir() if p.name.endswith((".cleaned", ".swap"))]


def run_with_worker(
    monkeypatch: pytest.MonkeyPatch, threads: LogCleanerThreads, around: Callable[[Callable[..., Any]], Any]
) -> bool:
    """One clean_once, with the worker call replaced by `around(run)` on the event loop."""

    async def fake_to_thread(function: Callable[..., Any], *args: Any) -> Any:
        return around(lambda: function(*args))

    monkeypatch.setattr(log_cleaner_threads.asyncio, "to_thread", fake_to_thread)

    async def once() -> bool:
        async with asyncio.timeout(30):
            return await threads.clean_once()

    return asyncio.run(once())


def test_a_clean_runs_on_a_worker_thread_and_shows_on_metrics(tmp_path: Path) -> None:
    manager, log = dirty_log(tmp_path)
    registry = CollectorRegistry()

    async def run() -> tuple[bool, bool]:
        threads = LogCleanerThreads(KafkaConfig({"log.dirs": str(tmp_path)}), manager, registry)
        async with asyncio.timeout(30):
            return await threads.clean_once(), await threads.clean_once()

    assert asyncio.run(run()) == (True, False)
    assert log.size_in_bytes < 1000
    metrics = generate_latest(registry).decode()
    assert "tierlog_log_cleaner_cleanings_total 1.0" in metrics
    assert "tierlog_log_cleaner_records_read_total 60.0" in metrics
    assert "tierlog_log_cleaner_records_kept_total 3.0" in metrics


def test_a_log_truncated_while_it_is_cleaned_keeps_its_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, log = dirty_log(tmp_path)
    threads = LogCleanerThreads(KafkaConfig({"log.dirs": str(tmp_path)}), manager, CollectorRegistry())

    def truncate_meanwhile(run: Callable[[], Any]) -> Any:
        result = run()
        log.truncate_to(30)
        return result

    assert not run_with_worker(monkeypatch, threads, truncate_meanwhile)
    assert leftovers(log) == []
    assert log.log_end_offset == 30 and threads.cleaner.aborted == 1
    assert threads.cleaner.manager.checkpoint(TP) is None and not threads.cleaner.manager.in_progress


def test_stopping_the_broker_gives_up_a_clean_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager, log = dirty_log(tmp_path)
    before = [segment.size for segment in log.segments]
    threads = LogCleanerThreads(KafkaConfig({"log.dirs": str(tmp_path)}), manager, CollectorRegistry())

    def stop_meanwhile(run: Callable[[], Any]) -> Any:
        threads._stopping = True
        return run()

    assert not run_with_worker(monkeypatch, threads, stop_meanwhile)
    assert leftovers(log) == []
    assert [segment.size for segment in log.segments] == before
    assert not threads.cleaner.manager.in_progress


def test_unreadable_data_marks_the_partition_uncleanable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager, _ = dirty_log(tmp_path)
    threads = LogCleanerThreads(KafkaConfig({"log.dirs": str(tmp_path)}), manager, CollectorRegistry())

    def fail(run: Callable[[], Any]) -> Any:
        raise OSError("disk error")

    assert not run_with_worker(monkeypatch, threads, fail)
    assert threads.cleaner.manager.uncleanable == {TP}
    assert threads.cleaner.grab(T0) is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("log.cleaner.threads", "0", "Invalid value 0 for configuration log.cleaner.threads: Value must be at least 1"),
        ("log.cleaner.io.buffer.load.factor", "lots", "Not a number of type DOUBLE"),
        ("log.cleaner.dedupe.buffer.size", "10", "too small"),
    ],
)
def test_bad_cleaner_settings_are_one_line_errors(tmp_path: Path, name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigException, match=message):
        LogCleanerThreads(
            KafkaConfig({"log.dirs": str(tmp_path), name: value}), LogManager([tmp_path], {}), CollectorRegistry()
        )
