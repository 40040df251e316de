"""A Spark standalone cluster on 127.0.0.1 from the pyspark package, for the tests and the benchmarks.

A master and N workers, each its own JVM (`org.apache.spark.deploy.master.Master`, `...worker.Worker`, started
by the package's bin/spark-class, as sbin/start-master.sh would), on free ports, each in a process group of its own:
`kill_worker` SIGKILLs a worker with everything it started (its executors, the JVMs it runs for an application,
and their Python workers) at once, as a host that dies.

    with LocalSparkCluster(tmp_path / "spark", workers=2) as spark_cluster:
        ... tierlog pipeline run --master spark_cluster.master_url ...
        spark_cluster.kill_worker(0)

The workers' environment is this process's without PYTHONPATH: an executor imports tierlog only from what the
job ships or from the Python it runs. Every wait is bounded; a daemon that does not come up raises
SparkStartError with its log's tail. Daemons never outlive their owner: stop() (or leaving the `with`), an exit
hook, and on Linux the kernel's parent-death signal.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyspark

from tierlog.testing.local_cluster import free_ports, wait_until
from tierlog.testing.local_process import LocalProcess, die_with_parent, with_log_tail

_HOST = "127.0.0.1"
SPARK_HOME = Path(pyspark.__file__).resolve().parent
# The daemons' own heap: they only keep track of workers and executors.
_DAEMON_HEAP = "256m"
_PROBE_TIMEOUT_S = 2.0
# An executor's JVM, as a worker starts it.
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

_LIVE_DAEMONS: set[SparkDaemon] = set()


@atexit.register
def _kill_leftover_daemons() -> None:
    for daemon in list(_LIVE_DAEMONS):
        daemon.kill()


class SparkStartError(RuntimeError):
    """A master or worker exited or did not come up in time; the message ends with the tail of its log."""


class SparkDaemon(LocalProcess):
    """One master or worker JVM in a process group of its own, its output appended to `log_file`, its scratch
    space (a worker's executors' block managers and shuffle files) in `local_dir`."""

    def __init__(self, name: str, main_class: str, arguments: list[str], log_file: Path, local_dir: Path) -> None:
        super().__init__(log_file)
        self.name = name
        self.local_dir = local_dir
        # spark-class sets up the environment (SPARK_SCALA_VERSION, which a worker needs to build its executors'
        # command) and then execs the JVM, so the process started is the daemon itself.
        self.command = ["bash", str(SPARK_HOME / "bin" / "spark-class"), main_class, *arguments]

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        # A worker builds its executors' command from SPARK_HOME's jars; both bind to the loopback address. Scratch
        # space under our directory rather than /tmp, where a killed worker would leave its executors' behind.
        self.local_dir.mkdir(parents=True, exist_ok=True)
        environment |= {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": _HOST,
            "SPARK_DAEMON_MEMORY": _DAEMON_HEAP,
            "SPARK_LOCAL_DIRS": str(self.local_dir),
        }
        self._spawn(
            self.command,
            env=environment,
            start_new_session=True,
            preexec_fn=die_with_parent(),
            header=f"\n==== {' '.join(self.command)}\n",
        )
        _LIVE_DAEMONS.add(self)

    def processes(self) -> dict[int, str]:
        """pid: command line of the daemon and every live process descending from it: for a worker, its executors
        and their Python workers (whose daemon leads a process group of its own)."""
        if self.pid is None:
            return {}
        table = _process_table()
        tree = {self.pid}
        grew = True
        while grew:
            children = {pid for pid, (parent, _) in table.items() if parent in tree} - tree
            tree |= children
            grew = bool(children)
        return {pid: table[pid][1] for pid in tree if pid in table}

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM to the daemon's group (a worker stops its executors), SIGKILL to everything it started after
        `timeout_s`; the exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout_s)
        self.kill()
        return process.returncode

    def kill(self) -> None:
        """SIGKILL the daemon and everything it started at once, as a machine that dies."""
        process = self._process
        if process is None:
            return
        # Once the daemon is reaped its pid may be another process's: only a running daemon's tree is looked up.
        started = self.processes() if process.poll() is None else {}
        self._signal_group(signal.SIGKILL)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # SIGKILL cannot be ignored; the bounds are only against a process stuck in the kernel.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(15.0)
        wait_until(lambda: not set(started) & set(_process_table()), 15.0, f"the processes of {self.name} to exit")
        _LIVE_DAEMONS.discard(self)

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)

    def __enter__(self) -> Self:
        self.start()
        return self


class LocalSparkCluster:
    """A standalone master and `workers` workers of `cores` cores and `memory` each, under `base_dir` (logs,
    the workers' work directories, where each executor runs and keeps its files)."""

    def __init__(self, base_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.base_dir = Path(base_dir).absolute()
        port, ui_port, *worker_ui_ports = free_ports(2 + workers)
        self.master_url = f"spark://{_HOST}:{port}"
        self.master_ui_url = f"http://{_HOST}:{ui_port}"
        self.master = SparkDaemon(
            "the Spark master",
            "org.apache.spark.deploy.master.Master",
            ["--host", _HOST, "--port", str(port), "--webui-port", str(ui_port)],
            self.base_dir / "master.log",
            self.base_dir / "local" / "master",
        )
        self.workers = [
            SparkDaemon(
                f"Spark worker {index}",
                "org.apache.spark.deploy.worker.Worker",
                [
                    self.master_url,
                    *("--host", _HOST, "--cores", str(cores), "--memory", memory),
                    *("--work-dir", str(self.work_dir(index)), "--webui-port", str(ui)),
                ],
                self.base_dir / f"worker-{index}.log",
                self.base_dir / "local" / f"worker-{index}",
            )
            for index, ui in enumerate(worker_ui_ports)
        ]

    def work_dir(self, index: int) -> Path:
        return self.base_dir / f"worker-{index}"

    def start(self, timeout_s: float = 90.0) -> None:
        """Start the master, then the workers; return once the master counts every worker alive. A daemon that
        exits or a cluster not up after `timeout_s` raises SparkStartError (and stops what was started)."""
        deadline = time.monotonic() + timeout_s
        try:
            self.master.start()
            self._wait(lambda: self.state() is not None, deadline, "the master's web UI to answer", self.master)
            for worker in self.workers:
                worker.start()
            self._wait(
                lambda: self.alive_workers() == len(self.workers),
                deadline,
                f"{len(self.workers)} workers registered with the master",
                *self.workers,
            )
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the workers (and their executors), then the master."""
        for daemon in [*self.workers, self.master]:
            daemon.stop(timeout_s)

    def state(self) -> dict[str, Any] | None:
        """The master's view of the cluster (its web UI's /json: workers, applications), None if it does not
        answer."""
        try:
            with urllib.request.urlopen(f"{self.master_ui_url}/json/", timeout=_PROBE_TIMEOUT_S) as response:
                return json.load(response)
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def alive_workers(self) -> int:
        state = self.state()
        return 0 if state is None else sum(1 for worker in state.get("workers", []) if worker["state"] == "ALIVE")

    def executors(self, index: int) -> list[int]:
        """The pids of the executor JVMs worker `index` runs now."""
        return [pid for pid, command in self.workers[index].processes().items() if _EXECUTOR_CLASS in command]

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker `index` together with its executors and their Python workers; returns the pids that
        were running."""
        worker = self.workers[index]
        running = list(worker.processes())
        worker.kill()
        return running

    def _wait(self, condition: Callable[[], object], deadline: float, what: str, *daemons: SparkDaemon) -> None:
        def up() -> bool:
            for daemon in daemons:
                if not daemon.running:
                    raise SparkStartError(
                        with_log_tail(f"{daemon.name} exited during start-up", daemon.log_file, daemon.log_tail())
                    )
            return bool(condition())

        try:
            wait_until(up, max(0.0, deadline - time.monotonic()), what, interval_s=0.2)
        except TimeoutError as e:
            daemon = daemons[0]
            raise SparkStartError(with_log_tail(str(e), daemon.log_file, daemon.log_tail())) from None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _process_table() -> dict[int, tuple[int, str]]:
    """pid: (parent pid, command line) of every live process (zombies, dead already, left out)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            table[int(entry)] = (int(parent), command)
    return table
