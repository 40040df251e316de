"""What the benchmarks share: the command line's --quick and --out, the machine facts every report records,
producing flat out, and writing the JSON report with its bar chart.

bench/ is on sys.path when a benchmark runs as a script (`python bench/throughput.py`), so they import this
as `common`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Producer

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TIMEOUT_S = 120.0


def argument_parser(doc: str | None, name: str, quick_help: str) -> argparse.ArgumentParser:
    """A parser with `--quick` and `--out` (default bench/results, where `name`.json and `name`.png go)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help=f"directory for {name}.json/.png")
    return parser


def commit_of(tree: Path) -> str:
    """The short commit a checkout is at (its git HEAD), as the JSON reports name builds."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False, cwd=tree
    ).stdout.strip()


@contextlib.contextmanager
def brokers_from(tree: Path) -> Iterator[None]:
    """Brokers started inside run the tierlog package of `tree`: LocalCluster passes os.environ to them. Without
    PYTHONSAFEPATH, `python -m tierlog` would put its working directory first on sys.path, and started from a
    tierlog checkout the brokers would import that checkout's package whatever PYTHONPATH says."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "PYTHONSAFEPATH")}
    os.environ.update(PYTHONPATH=str(tree), PYTHONSAFEPATH="1")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = commit_of(Path(__file__).parent)
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "tierlog_commit": commit,
    }


def tiered_broker_overrides(
    rsm_properties: dict[str, str], brokers: int, task_interval_ms: int = 500
) -> dict[str, str]:
    """Broker settings for a benchmark's tiered cluster: the remote tier on (its RSM's `rsm_properties`), the copier
    and retention checked every `task_interval_ms`, and the remote log metadata topic one partition replicated on
    every broker (the numbers are about tiering, not about that topic)."""
    return {
        "remote.log.storage.system.enable": "true",
        **rsm_properties,
        "remote.log.manager.task.interval.ms": str(task_interval_ms),
        "log.retention.check.interval.ms": str(task_interval_ms),
        "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
        "rlmm.config.remote.log.metadata.topic.replication.factor": str(brokers),
    }


def producer_config(bootstrap: str, acks: str | int, linger_ms: int, queue: int, timeout_s: float) -> dict[str, Any]:
    """The benchmarks' producer: big uncompressed batches, a deep queue, no idempotence (it would rule out
    acks=1, and the benchmarks measure the log, not sequencing)."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "enable.idempotence": False,
        "linger.ms": linger_ms,
        "batch.size": 1_000_000,
        "compression.type": "none",
        "queue.buffering.max.messages": queue,
        "queue.buffering.max.kbytes": 512 * 1024,
        "message.timeout.ms": int(timeout_s * 1000),
    }


def consumer_config(bootstrap: str, partition_fetch_bytes: int) -> dict[str, Any]:
    """The benchmarks' consumer: assign() only, large fetches, and a queue deep enough to keep prefetching."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": "bench-unused",  # required by librdkafka; we only assign(), never join or commit
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "fetch.max.bytes": 50 * 1024 * 1024,
        "max.partition.fetch.bytes": partition_fetch_bytes,
        "queued.max.messages.kbytes": 256 * 1024,
        # librdkafka stops prefetching once 100k messages wait in its queue (the default); with 1 KiB
        # messages that caps one partition at ~150 MB/s while the broker idles at <10% CPU.
        "queued.min.messages": 1_000_000,
    }


def produce_flat_out(
    producer: Producer,
    topic: str,
    payload: bytes,
    on_delivery: Callable[..., None],
    seconds: float,
    max_messages: int | None = None,
) -> int:
    """Produce `payload` as fast as the client takes it, for `seconds` or, if given, exactly `max_messages`;
    returns how many were handed to the client. A full client queue is served (poll) until there is room."""
    sent = 0
    stop_at = time.perf_counter() + seconds
    while sent < max_messages if max_messages is not None else time.perf_counter() < stop_at:
        for _ in range(1000 if max_messages is None else min(1000, max_messages - sent)):
            try:
                producer.produce(topic, payload, on_delivery=on_delivery)
                sent += 1
            except BufferError:
                producer.poll(0.005)
        producer.poll(0)
    return sent


def paired_bars(ax: Any, series: Sequence[tuple[str, Sequence[float], str]], value_format: str) -> None:
    """Two bars per x position side by side, (label, values, color) each, every bar labelled with its value."""
    width = 0.38
    for shift, (label, values, color) in zip((-width / 2, width / 2), series, strict=True):
        bars = ax.bar([i + shift for i in range(len(values))], values, width, label=label, color=color)
        ax.bar_label(bars, labels=[value_format.format(v) for v in values], fontsize=8, padding=2)
    ax.legend()


def write_report(
    out: Path,
    name: str,
    report: dict[str, Any],
    *,
    title: str,
    labels: Sequence[str],
    panels: int,
    figsize: tuple[float, float],
    draw: Callable[[Sequence[Any]], None],
) -> None:
    """`out`/`name`.json (the report) and `out`/`name`.png: a row of `panels` bar charts, drawn by `draw(axes)`,
    sharing the x positions `labels`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    fig, grid = plt.subplots(1, panels, figsize=figsize, squeeze=False)
    axes = list(grid[0])
    draw(axes)
    for ax in axes:
        ax.set_xticks(list(range(len(labels))), labels)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out / f'{name}.json'} and {out / f'{name}.png'}")
