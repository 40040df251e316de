"""Produce and consume throughput over PLAINTEXT and over SSL on one local tierlog broker (confluent-kafka,
1 KiB records, acks=1, linger.ms=5, batch.size=1 MB, one partition), and how a TLS connection sends record
bytes from a segment file.

The broker listens on both protocols (a trustme certificate, TLS 1.3); each protocol gets its own topic,
produced to for about `--seconds` and then consumed from the beginning (assign, no group). Under TLS the
kernel cannot sendfile the segment: the broker reads it in 1 MiB preads and writes them (tierlog/server/
connection.py); the second part compares that with asyncio's loop.sendfile fallback (256 KiB reads in a
thread pool) by sending a 256 MiB file over a local TLS connection each way, in this process.

    python bench/tls.py            # 3 rounds of ~6 s of producing per protocol, in turns; the best is plotted
    python bench/tls.py --quick    # one round of ~1.5 s, for a smoke run

Writes `bench/results/tls.json` (machine, load, parameters, results) and `bench/results/tls.png`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trustme
from common import argument_parser, machine_info, paired_bars, write_report
from throughput import consume, create_topic, produce

from tierlog.server.connection import TLS_READ_BYTES, send_chunks
from tierlog.storage.file_records import FileSlice
from tierlog.testing.local_cluster import BrokerProcess, free_ports

MESSAGE_BYTES = 1024
SEND_FILE_BYTES = 256 * 1024 * 1024


def tls_files(directory: Path) -> tuple[Path, Path]:
    """(CA certificate, broker key store) as PEM files."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(directory / "ca.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(directory / "broker.pem")
    return directory / "ca.pem", directory / "broker.pem"


def load() -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    return {"1min": round(one, 2), "5min": round(five, 2), "15min": round(fifteen, 2)}


async def _send_file_over_tls(path: Path, ca: Path, keystore: Path, *, sendfile_fallback: bool) -> float:
    """Seconds to send `path` from a TLS server to a TLS client that reads it all, in this process."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(keystore)
    client_context = ssl.create_default_context(cafile=str(ca))
    size = path.stat().st_size
    done = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with path.open("rb") as file:
            started = time.perf_counter()
            if sendfile_fallback:
                await asyncio.get_running_loop().sendfile(writer.transport, file, 0, size)
                await writer.drain()
            else:
                await send_chunks(writer, [FileSlice(file, 0, size)])
            done.set_result(started)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
        received = 0
        while received < size:
            chunk = await reader.read(4 * 1024 * 1024)
            if not chunk:
                raise RuntimeError(f"connection closed after {received} of {size} bytes")
            received += len(chunk)
        finished = time.perf_counter()
        started = await done
        writer.close()
        await writer.wait_closed()
    return finished - started


def send_path(work_dir: Path, ca: Path, keystore: Path) -> dict[str, Any]:
    path = work_dir / "segment.bin"
    path.write_bytes(os.urandom(SEND_FILE_BYTES))
    results = {}
    for name, fallback in (("pread_1mib", False), ("asyncio_sendfile_fallback", True)):
        best = min(asyncio.run(_send_file_over_tls(path, ca, keystore, sendfile_fallback=fallback)) for _ in range(3))
        results[name] = {"seconds": round(best, 3), "mb_per_s": round(SEND_FILE_BYTES / best / 1e6, 1)}
        print(f"TLS send of {SEND_FILE_BYTES >> 20} MiB by {name}: {results[name]['mb_per_s']} MB/s", flush=True)
    path.unlink()
    return results


def main() -> None:
    parser = argument_parser(__doc__, "tls", "about 1.5 s of producing per protocol")
    parser.add_argument("--seconds", type=float, default=6.0, help="produce for this long per protocol")
    parser.add_argument("--rounds", type=int, default=3, help="measure each protocol this many times, in turns")
    args = parser.parse_args()
    seconds = 1.5 if args.quick else args.seconds

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-tls-"))
    ca, keystore = tls_files(work_dir)
    plaintext_port, ssl_port = free_ports(2)
    broker = BrokerProcess(
        work_dir / "data",
        port=plaintext_port,
        overrides={
            "listeners": f"PLAINTEXT://127.0.0.1:{plaintext_port},SSL://127.0.0.1:{ssl_port}",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "log.retention.check.interval.ms": "300000",
        },
    )
    protocols = {
        "PLAINTEXT": (f"127.0.0.1:{plaintext_port}", {}),
        "SSL": (f"127.0.0.1:{ssl_port}", {"security.protocol": "SSL", "ssl.ca.location": str(ca)}),
    }
    load_before = load()
    rounds: list[dict[str, Any]] = []
    try:
        broker.start()
        broker.wait_ready(60)
        # The protocols take turns, so a burst of load from the machine's other users hits both alike.
        for round_number in range(1 if args.quick else args.rounds):
            for protocol, (bootstrap, client) in protocols.items():
                topic = f"bench-tls-{protocol.lower()}-{round_number}"
                create_topic(broker.bootstrap, topic, 1)
                produced = produce(bootstrap, topic, MESSAGE_BYTES, seconds, None, client)
                consumed = consume(bootstrap, topic, 1, produced.messages, MESSAGE_BYTES, client)
                rounds.append({"protocol": protocol, "produce": produced.to_json(), "consume": consumed.to_json()})
                print(
                    f"{protocol:>9}: {produced.messages:>9,} messages  produce {produced.mb_per_s:7.1f} MB/s  "
                    f"consume {consumed.mb_per_s:7.1f} MB/s",
                    flush=True,
                )
    finally:
        exit_code = broker.stop(60)
    if exit_code not in (0, None):
        print(f"warning: the broker exited with code {exit_code}", file=sys.stderr)
    results = [
        {
            "protocol": protocol,
            **{
                phase: max((r[phase] for r in rounds if r["protocol"] == protocol), key=lambda p: p["mb_per_s"])
                for phase in ("produce", "consume")
            },
        }
        for protocol in protocols
    ]
    sending = send_path(work_dir, ca, keystore)
    shutil.rmtree(work_dir, ignore_errors=True)

    report = {
        "benchmark": "tierlog produce/consume throughput over PLAINTEXT and SSL, confluent-kafka, one local broker",
        "machine": machine_info(),
        # The machine is shared: the load average says how much else ran while this was measured.
        "load_average": {"before": load_before, "after": load()},
        "parameters": {
            "produce_seconds": seconds,
            "rounds": 1 if args.quick else args.rounds,
            "message_bytes": MESSAGE_BYTES,
            "partitions": 1,
            "producer": {"acks": 1, "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none"},
            "consumer": "assign() from the beginning, no consumer group, queued.min.messages=1000000",
            "tls": f"{ssl.OPENSSL_VERSION}, TLS 1.3 (Python's and librdkafka's default), server authentication only",
            "units": "MB = 10^6 payload bytes (keys are null; record overhead not counted)",
            "tls_send_read_bytes": TLS_READ_BYTES,
        },
        # The best round of each protocol and phase (the least disturbed by other work), then every round.
        "results": results,
        "rounds": rounds,
        "tls_file_send": {"file_bytes": SEND_FILE_BYTES, "best_of": 3, **sending},
    }
    write_report(
        args.out,
        "tls",
        report,
        title=f"tierlog over PLAINTEXT and SSL, 1 KiB records, 1 partition ({report['machine']['cpu_count']} CPUs)",
        labels=["produce", "consume"],
        panels=1,
        figsize=(7, 4.8),
        draw=lambda axes: draw(axes, results),
    )


def draw(axes: Any, results: list[dict[str, Any]]) -> None:
    by_protocol = {r["protocol"]: r for r in results}
    series = [
        (protocol, [by_protocol[protocol][phase]["mb_per_s"] for phase in ("produce", "consume")], color)
        for protocol, color in (("PLAINTEXT", "#3b7dd8"), ("SSL", "#2a9d55"))
    ]
    paired_bars(axes[0], series, "{:,.0f}")
    axes[0].set_ylabel("MB/s")


if __name__ == "__main__":
    main()
