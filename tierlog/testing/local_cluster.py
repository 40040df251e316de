"""Brokers run as local processes on 127.0.0.1: for `tierlog demo`, `tierlog cluster`, the tests and the
benchmarks.

Each `BrokerProcess` is one `python -m tierlog broker` with its own node id, port and data directory (a broker,
or with process.roles=controller a dedicated controller); a `LocalCluster` is several of them side by side, as
`tierlog cluster up` starts them: node 1 broker and controller and the others reaching it, or N dedicated
controllers (node ids 3000, 3001, ...) and brokers 1..M, or the first N brokers combined with the controller.
Every wait is bounded; a node that does not come up raises `BrokerStartError` with the tail of its log, which
is where the reason is.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Self, TypeVar

from tierlog.client.probes import api_versions_answered, metadata_broker_ids
from tierlog.testing.local_process import LocalProcess, with_log_tail
from tierlog.testing.local_security import CLIENT_LISTENER, LocalSecurity

_HOST = "127.0.0.1"
_POLL_INTERVAL_S = 0.05
# A probe of a paused broker must not eat the whole wait: each request gets at most this long.
_PROBE_TIMEOUT_S = 1.0


class BrokerStartError(RuntimeError):
    """The broker process exited or did not answer in time; the message ends with its log's tail.

    `reason` is the message without the tail, for callers that show the log differently."""

    def __init__(self, reason: str, node_id: int, log_file: Path, log_tail: str) -> None:
        super().__init__(with_log_tail(reason, log_file, log_tail))
        self.reason = reason
        self.node_id = node_id
        self.log_file = log_file
        self.log_tail = log_tail


T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None], timeout_s: float, what: str | Callable[[], str], interval_s: float = 0.05
) -> T:
    """Poll until `condition()` returns something truthy and return it; after `timeout_s` raise TimeoutError
    naming `what` (a callable is asked then, so the message can describe the state at that moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {described}")
        time.sleep(interval_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: all sockets stay bound until every port is chosen, so the OS cannot hand
    out the same port twice."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((_HOST, 0))
            ports.append(sock.getsockname()[1])
        return ports


class BrokerProcess(LocalProcess):
    """One broker subprocess: `sys.executable -m tierlog broker --override ...`.

    Its stdout and stderr go to `log_file` (default: `broker-<node_id>.log` next to `log_dir`, so the
    log survives when a test wipes the data directory). The port is chosen once, so a restarted broker
    comes back at the same `bootstrap` address and clients reconnect to it. A `detached` broker runs in a
    session of its own, so it outlives the command that started it and the terminal's Ctrl-C.

        with BrokerProcess(tmp_path / "broker-1") as broker:   # started and ready
            produce_to(broker.bootstrap)
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        node_id: int = 1,
        port: int | None = None,
        overrides: Mapping[str, str] | None = None,
        log_file: Path | None = None,
        detached: bool = False,
        probe_port: int | None = None,
    ) -> None:
        super().__init__(log_file if log_file is not None else log_dir.parent / f"broker-{node_id}.log")
        self.log_dir = log_dir
        self.node_id = node_id
        self.port = port if port is not None else free_port()
        # Where the readiness probes ask: the client port, unless that one needs TLS and SASL (a secured local
        # cluster), when it is the PLAINTEXT inter-broker listener on 127.0.0.1.
        self.probe_port = probe_port if probe_port is not None else self.port
        self.overrides = dict(overrides or {})
        self.detached = detached
        self._paused = False

    @property
    def bootstrap(self) -> str:
        return f"{_HOST}:{self.port}"

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def command(self) -> list[str]:
        settings = {
            "node.id": str(self.node_id),
            "listeners": f"PLAINTEXT://{_HOST}:{self.port}",
            "log.dirs": str(self.log_dir),
            **self.overrides,
        }
        args = [sys.executable, "-m", "tierlog", "broker"]
        for key, value in settings.items():
            args += ["--override", f"{key}={value}"]
        return args

    def start(self) -> None:
        """Spawn the process; `wait_ready` tells when it serves."""
        if self.running:
            raise RuntimeError(f"broker {self.node_id} is already running (pid {self.pid})")
        self.log_dir.parent.mkdir(parents=True, exist_ok=True)
        self._spawn(self.command(), env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=self.detached)
        self._paused = False

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Return once the port accepts connections and answers ApiVersions; raise `BrokerStartError`
        if the process exits first or `timeout_s` passes."""
        self._wait_for(
            lambda probe_s: api_versions_answered(_HOST, self.probe_port, timeout_s=probe_s),
            timeout_s,
            f"did not answer ApiVersions on {self.bootstrap}",
        )

    def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Return once the broker's own Metadata answer lists it, i.e. the controller has registered and
        unfenced it; raise `BrokerStartError` if the process exits first or `timeout_s` passes."""

        def listed(probe_s: float) -> bool:
            ids = metadata_broker_ids(_HOST, self.probe_port, timeout_s=probe_s)
            return ids is not None and self.node_id in ids

        self._wait_for(
            listed, timeout_s, "is not in its own metadata (not registered with the controller, or still fenced)"
        )

    def _wait_for(self, probe: Callable[[float], bool], timeout_s: float, failure: str) -> None:
        """Poll `probe` (given how long it may take) until it holds, while the process lives, for `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.start_error(f"broker {self.node_id} {failure} within {timeout_s:.0f}s")
            if probe(min(_PROBE_TIMEOUT_S, remaining)):
                return
            time.sleep(min(_POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))

    def check_alive(self) -> None:
        """Raise `BrokerStartError` (with the log's tail) if the process has exited."""
        code = self._require_process().poll()
        if code is not None:
            raise self.start_error(f"broker {self.node_id} exited with code {code}")

    def start_error(self, reason: str) -> BrokerStartError:
        return BrokerStartError(reason, self.node_id, self.log_file, self.log_tail())

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Controlled shutdown (SIGTERM); SIGKILL if it has not exited after `timeout_s`.

        Returns the exit code (None if it was never started)."""
        self.terminate()
        return self.wait_stopped(timeout_s)

    def terminate(self) -> None:
        """Ask for a controlled shutdown (SIGTERM) without waiting; `wait_stopped` waits."""
        if self._process is None or self._process.poll() is not None:
            return
        if self._paused:
            # A stopped process only acts on SIGTERM once it runs again.
            self.resume()
        self._process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 15.0) -> int | None:
        """Wait for the exit; SIGKILL after `timeout_s`. Returns the exit code (None if never started)."""
        if self._process is None:
            return None
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout_s)
        return self._process.returncode

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 15.0) -> None:
        """Send `sig` (a crash by default); for SIGKILL wait until the process is gone."""
        process = self._require_process()
        if process.poll() is not None:
            return
        process.send_signal(sig)
        if sig == signal.SIGKILL:
            process.wait(timeout_s)
            self._paused = False

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its sockets but answers nothing, like a long GC pause."""
        self._require_process().send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        self._require_process().send_signal(signal.SIGCONT)
        self._paused = False

    def restart(self, timeout_s: float = 30.0) -> None:
        """Controlled shutdown, then start again on the same port and data directory and wait until ready."""
        self.stop(timeout_s)
        self.start()
        self.wait_ready(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError(f"broker {self.node_id} was never started")
        return self._process


CONTROLLER_NODE_ID = 1
CONTROLLER_LISTENER = "CONTROLLER"
# A secured cluster's brokers reach each other here: PLAINTEXT, bound to 127.0.0.1 only.
INTERNAL_LISTENER = "INTERNAL"
# Set per node by LocalCluster: an override of one of them would point the nodes at the wrong addresses.
_NODE_SETTINGS = frozenset(
    {
        "process.roles",
        "node.id",
        "listeners",
        "controller.listener.names",
        "controller.quorum.voters",
        "controller.quorum.bootstrap.servers",
        "tierlog.http.listener",
        "log.dirs",
    }
)
# Set too by a secured cluster, whose listeners they describe.
_SECURE_NODE_SETTINGS = frozenset({"listener.security.protocol.map", "inter.broker.listener.name"})


# Dedicated controllers are nodes 3000, 3001, ... (as in Kafka's examples), so brokers keep ids 1..M.
FIRST_DEDICATED_CONTROLLER_ID = 3000


class StartProgress(NamedTuple):
    """How far `LocalCluster.start` is: brokers answering ApiVersions, brokers every answering broker's
    Metadata lists (registered and unfenced), out of `total`; dedicated controllers answering ApiVersions, out
    of `controllers` (0 when the controllers are brokers too)."""

    answering: int
    registered: int
    total: int
    controllers_answering: int = 0
    controllers: int = 0


def next_broker_id(node_ids: Sequence[int]) -> int:
    """The id a broker added to a cluster of `node_ids` gets: one past the highest broker's (dedicated
    controllers, from 3000 on, aside)."""
    return max((n for n in node_ids if n < FIRST_DEDICATED_CONTROLLER_ID), default=0) + 1


class AddedBroker(NamedTuple):
    """The settings of a broker added to a running cluster, and its ports."""

    settings: dict[str, str]
    port: int  # the first listener's: the client listener
    http_port: int
    probe_port: int  # where readiness is asked: a secured cluster's INTERNAL listener, else `port`
    listener_ports: dict[tuple[str, int], int]  # (listener name, node id) -> port


def broker_settings_like(template: Mapping[str, str], node_id: int) -> AddedBroker:
    """The server.properties overrides of a new broker `node_id` like the broker whose overrides are `template`
    (same controllers, listener names and every other setting) but on free ports of its own, and only a broker
    even if the template is a controller too."""
    listeners = [
        listener
        for listener in template["listeners"].split(",")
        if not listener.startswith(f"{CONTROLLER_LISTENER}://")
    ]
    ports = free_ports(len(listeners) + 1)
    renamed, by_name = [], {}
    for listener, port in zip(listeners, ports, strict=False):
        name, _, address = listener.partition("://")
        renamed.append(f"{name}://{address.rpartition(':')[0]}:{port}")
        by_name[name] = port
    settings = {
        **template,
        "process.roles": "broker",
        "node.id": str(node_id),
        "listeners": ",".join(renamed),
        "tierlog.http.listener": f"{_HOST}:{ports[-1]}",
    }
    return AddedBroker(
        settings,
        port=ports[0],
        http_port=ports[-1],
        probe_port=by_name.get(INTERNAL_LISTENER, ports[0]),
        listener_ports={(name, node_id): port for name, port in by_name.items()},
    )


class LocalCluster:
    """`brokers` broker processes on 127.0.0.1 forming one cluster. The controller quorum
    (`controller.quorum.voters`) is, with `controllers=0`, node 1 alone, broker and controller (KRaft combined
    mode), the other brokers reaching its CONTROLLER listener; with `controllers=N`, N dedicated controller
    processes (process.roles=controller, nodes 3000..3000+N-1, data in `base_dir/controller-<id>`) and brokers
    1..M with process.roles=broker; with `controllers=N, combined=True`, brokers 1..N, each broker and
    controller. Broker i keeps its data in `base_dir/broker-i` and its log in `base_dir/broker-i.log`; every
    broker serves HTTP (metrics, partitions, trace) at `http_address(i)`. `overrides` go to every node. Each name
    in `extra_listeners` (e.g. "SSL") is one more listener on every broker, at `listener_address(name, i)`, its
    protocol and settings given by the overrides (a cluster whose brokers talk over TLS:
    tests/security/test_tls_cluster.py).

    With `security` (`LocalSecurity.generate(...)`), clients are served on a SASL_SSL listener (PLAIN, the
    generated admin user, the generated broker certificate) and the brokers talk to each other on a PLAINTEXT
    listener, INTERNAL, bound to 127.0.0.1, where the readiness probes ask too (`internal_bootstrap`).

    All ports are chosen once, so a restarted broker comes back at the same addresses.

        with LocalCluster(tmp_path, brokers=3, overrides={"default.replication.factor": "3"}) as cluster:
            produce_to(cluster.bootstrap)
            cluster.kill(2)
            cluster.wait_for_brokers(2, timeout_s=30)
    """

    def __init__(
        self,
        base_dir: Path,
        brokers: int = 3,
        overrides: Mapping[str, str] | None = None,
        *,
        detached: bool = False,
        extra_listeners: Sequence[str] = (),
        security: LocalSecurity | None = None,
        controllers: int = 0,
        combined: bool = False,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, not {brokers}")
        if controllers < 0:
            raise ValueError(f"controllers must be 0 (node 1 is the controller) or more, not {controllers}")
        if combined and not 1 <= controllers <= brokers:
            raise ValueError(f"combined controllers are brokers too: 1 to {brokers} of them, not {controllers}")
        per_node = _NODE_SETTINGS | (_SECURE_NODE_SETTINGS if security is not None else frozenset())
        clashing = sorted(per_node & set(overrides or {}))
        if clashing:
            raise ValueError(f"{', '.join(clashing)} is set per node by the cluster and cannot be overridden")
        self.base_dir = base_dir
        self.overrides = dict(overrides or {})
        self.security = security
        node_ids = range(1, brokers + 1)
        if combined:
            self.controller_ids = list(range(1, controllers + 1))
        elif controllers:
            self.controller_ids = list(
                range(FIRST_DEDICATED_CONTROLLER_ID, FIRST_DEDICATED_CONTROLLER_ID + controllers)
            )
        else:
            self.controller_ids = [CONTROLLER_NODE_ID]
        self._dedicated_controllers = not combined and controllers > 0
        # Per broker a client port, an HTTP port, one per extra listener and a secured cluster's inter-broker
        # port; one controller port per voter.
        per_node = 2 + len(extra_listeners) + (0 if security is None else 1)
        ports = free_ports(len(self.controller_ids) + per_node * brokers)
        self.controller_ports = dict(zip(self.controller_ids, ports, strict=False))
        broker_ports = ports[len(self.controller_ids) :]
        self._kafka_ports = {node_id: broker_ports[node_id - 1] for node_id in node_ids}
        self._http_ports = {node_id: broker_ports[brokers + node_id - 1] for node_id in node_ids}
        # Listeners besides PLAINTEXT (e.g. SSL, for an inter-broker listener over TLS), each node on a port
        # of its own; their protocols and settings come from the overrides.
        self._extra_ports = {
            (name.upper(), node_id): broker_ports[(2 + i) * brokers + node_id - 1]
            for i, name in enumerate(extra_listeners)
            for node_id in node_ids
        }
        self._internal_ports = (
            {node_id: broker_ports[(per_node - 1) * brokers + node_id - 1] for node_id in node_ids}
            if security is not None
            else {}
        )
        self._detached = detached
        self._brokers = {node_id: self._broker_process(node_id, self._node_settings(node_id)) for node_id in node_ids}
        # Dedicated controllers are processes too; their one listener is the controller's, where they are probed.
        self._controllers = {
            node_id: BrokerProcess(
                base_dir / f"controller-{node_id}",
                node_id=node_id,
                port=self.controller_ports[node_id],
                overrides={**self.overrides, **self._controller_settings(node_id)},
                log_file=base_dir / f"controller-{node_id}.log",
                detached=detached,
            )
            for node_id in (self.controller_ids if self._dedicated_controllers else ())
        }

    def _broker_process(self, node_id: int, settings: Mapping[str, str]) -> BrokerProcess:
        return BrokerProcess(
            self.base_dir / f"broker-{node_id}",
            node_id=node_id,
            port=self._kafka_ports[node_id],
            overrides={**self.overrides, **settings},
            log_file=self.base_dir / f"broker-{node_id}.log",
            detached=self._detached,
            probe_port=self._internal_ports.get(node_id),
        )

    def add_broker(self, timeout_s: float = 60.0) -> int:
        """Start one more broker, the next node id, with the settings of the others (the same controllers,
        overrides, remote storage) on ports of its own, and wait until every running broker's Metadata lists it:
        its id. It has no replica until partitions are reassigned to it."""
        template = self._brokers[max(self._brokers)].overrides
        node_id = next_broker_id(self.node_ids)
        added = broker_settings_like(template, node_id)
        self._kafka_ports[node_id] = added.port
        self._http_ports[node_id] = added.http_port
        if self.security is not None:
            self._internal_ports[node_id] = added.probe_port
        for (name, _), port in added.listener_ports.items():
            if (name, max(self._brokers)) in self._extra_ports:
                self._extra_ports[(name, node_id)] = port
        broker = self._brokers[node_id] = self._broker_process(node_id, added.settings)
        deadline = time.monotonic() + timeout_s
        broker.start()
        broker.wait_ready(timeout_s)
        try:
            self._wait_for_metadata(
                lambda ids: node_id in ids, f"broker {node_id}", max(0.1, deadline - time.monotonic())
            )
        except TimeoutError as e:
            raise broker.start_error(str(e)) from None
        return node_id

    @property
    def quorum_voters(self) -> str:
        """controller.quorum.voters of every node: id@host:port of each voter's controller listener."""
        return ",".join(f"{node_id}@{_HOST}:{port}" for node_id, port in self.controller_ports.items())

    def roles(self, node_id: int) -> str:
        """process.roles of a node."""
        if node_id not in self.controller_ids:
            return "broker"
        return "controller" if self._dedicated_controllers else "broker,controller"

    def _controller_settings(self, node_id: int) -> dict[str, str]:
        return {
            "process.roles": "controller",
            "node.id": str(node_id),
            "listeners": f"{CONTROLLER_LISTENER}://{_HOST}:{self.controller_ports[node_id]}",
            "controller.listener.names": CONTROLLER_LISTENER,
            "controller.quorum.voters": self.quorum_voters,
        }

    def _node_settings(self, node_id: int) -> dict[str, str]:
        is_controller = node_id in self.controller_ids
        listeners = [f"PLAINTEXT://{_HOST}:{self._kafka_ports[node_id]}"]
        secure: dict[str, str] = {}
        if self.security is not None:
            listeners = [
                f"{CLIENT_LISTENER}://{_HOST}:{self._kafka_ports[node_id]}",
                f"{INTERNAL_LISTENER}://{_HOST}:{self._internal_ports[node_id]}",
            ]
            secure = {
                "listener.security.protocol.map": (
                    f"{CLIENT_LISTENER}:SASL_SSL,{INTERNAL_LISTENER}:PLAINTEXT,{CONTROLLER_LISTENER}:PLAINTEXT"
                ),
                "inter.broker.listener.name": INTERNAL_LISTENER,
                **self.security.broker_settings(),
            }
        listeners += [f"{name}://{_HOST}:{port}" for (name, node), port in self._extra_ports.items() if node == node_id]
        if is_controller:
            listeners.append(f"{CONTROLLER_LISTENER}://{_HOST}:{self.controller_ports[node_id]}")
        return {
            "process.roles": self.roles(node_id),
            "node.id": str(node_id),
            "listeners": ",".join(listeners),
            "controller.listener.names": CONTROLLER_LISTENER,
            "controller.quorum.voters": self.quorum_voters,
            "tierlog.http.listener": self.http_address(node_id),
            **secure,
        }

    @property
    def node_ids(self) -> list[int]:
        """Every node: the brokers, then the dedicated controllers."""
        return [*self._brokers, *self._controllers]

    @property
    def broker_ids(self) -> list[int]:
        return list(self._brokers)

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self._brokers.values())

    @property
    def internal_bootstrap(self) -> str:
        """The brokers' inter-broker listeners (PLAINTEXT, 127.0.0.1): the client listeners unless secured."""
        return ",".join(f"{_HOST}:{broker.probe_port}" for broker in self._brokers.values())

    @property
    def controller_address(self) -> str:
        """The first voter's controller listener."""
        return self.controller_addresses[0]

    @property
    def controller_addresses(self) -> list[str]:
        """Every voter's controller listener (host:port), as `--bootstrap-controller` takes them."""
        return [f"{_HOST}:{port}" for port in self.controller_ports.values()]

    def broker(self, node_id: int) -> BrokerProcess:
        """The process of a node (a dedicated controller's too)."""
        try:
            return self._brokers[node_id] if node_id in self._brokers else self._controllers[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id} in this cluster (nodes {self.node_ids})") from None

    def listener_address(self, name: str, node_id: int) -> str:
        """host:port of one of the `extra_listeners` on a node."""
        return f"{_HOST}:{self._extra_ports[(name.upper(), node_id)]}"

    def http_address(self, node_id: int) -> str:
        return f"{_HOST}:{self._http_ports[node_id]}"

    def start(self, timeout_s: float = 60.0, progress: Callable[[StartProgress], None] | None = None) -> None:
        """Start every broker that is not running and wait until each answers ApiVersions and each one's
        Metadata lists all of them. On failure every broker is stopped and `BrokerStartError` names the
        first broker that is missing, with its log's tail."""
        try:
            self.launch()
            self._wait_started(timeout_s, progress)
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Spawn every node that is not running, controllers first, without waiting (`start` waits): the pids
        are known at once, for a caller that must record them before it waits."""
        for process in (*self._controllers.values(), *self._brokers.values()):
            if not process.running:
                process.start()

    def _wait_started(self, timeout_s: float, progress: Callable[[StartProgress], None] | None) -> None:
        everyone = set(self._brokers)
        deadline = time.monotonic() + timeout_s
        answering: set[int] = set()
        while True:
            for process in (*self._controllers.values(), *self._brokers.values()):
                process.check_alive()
            for node_id in sorted(set(self.node_ids) - answering):
                probe_s = min(_PROBE_TIMEOUT_S, max(0.01, deadline - time.monotonic()))
                if api_versions_answered(_HOST, self.broker(node_id).probe_port, probe_s):
                    answering.add(node_id)
            registered = self._listed_by_all(answering & everyone)
            controllers_answering = len(answering & set(self._controllers))
            if progress is not None:
                progress(
                    StartProgress(
                        len(answering & everyone),
                        len(registered & everyone),
                        len(everyone),
                        controllers_answering,
                        len(self._controllers),
                    )
                )
            if answering >= set(self.node_ids) and registered >= everyone:
                return
            if time.monotonic() >= deadline:
                silent = set(self.node_ids) - answering
                missing = min(silent or everyone - registered)
                process = self.broker(missing)
                kind = "controller" if missing in self._controllers else "broker"
                if missing in silent:
                    reason = f"did not answer ApiVersions on {process.bootstrap}"
                else:
                    reason = "is not in the cluster's metadata (not registered, or still fenced)"
                raise process.start_error(f"{kind} {missing} {reason} within {timeout_s:.0f}s")
            time.sleep(_POLL_INTERVAL_S)

    def _listed_by_all(self, node_ids: set[int]) -> set[int]:
        """The brokers the Metadata answer of every broker in `node_ids` lists (none if one does not answer)."""
        listed: set[int] | None = None
        for node_id in sorted(node_ids):
            ids = metadata_broker_ids(_HOST, self._brokers[node_id].probe_port, _PROBE_TIMEOUT_S)
            if ids is None:
                return set()
            listed = ids if listed is None else listed & ids
        return listed or set()

    def metadata_views(self) -> dict[int, set[int] | None]:
        """node id -> the brokers its Metadata answer lists (None: no answer), for every running broker
        that is not paused."""
        return {
            node_id: metadata_broker_ids(_HOST, broker.probe_port, _PROBE_TIMEOUT_S)
            for node_id, broker in self._brokers.items()
            if broker.running and not broker.paused
        }

    def wait_for_brokers(self, n: int, timeout_s: float = 30.0) -> None:
        """Wait until the Metadata of every running, unpaused broker lists exactly `n` brokers (a killed
        broker drops out once the controller fences it, after `broker.session.timeout.ms`); TimeoutError
        with what each one listed otherwise."""
        self._wait_for_metadata(lambda ids: len(ids) == n, f"{n} brokers", timeout_s)

    def _wait_for_metadata(self, condition: Callable[[set[int]], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            views = self.metadata_views()
            if views and all(ids is not None and condition(ids) for ids in views.values()):
                return
            if time.monotonic() >= deadline:
                seen = "; ".join(
                    f"broker {node_id}: {'no answer' if ids is None else sorted(ids)}" for node_id, ids in views.items()
                )
                raise TimeoutError(f"metadata did not list {what} within {timeout_s:.0f}s ({seen or 'no broker runs'})")
            time.sleep(_POLL_INTERVAL_S)

    def kill(self, node_id: int) -> None:
        """SIGKILL: a crash; the controller fences the broker once its session times out."""
        self.broker(node_id).kill(signal.SIGKILL)

    def pause(self, node_id: int) -> None:
        self.broker(node_id).pause()

    def resume(self, node_id: int) -> None:
        self.broker(node_id).resume()

    def restart(self, node_id: int, timeout_s: float = 60.0) -> None:
        """Controlled shutdown (if running), start on the same addresses and data, and wait until it answers
        and (a broker) every running broker's Metadata lists it again."""
        broker = self.broker(node_id)
        deadline = time.monotonic() + timeout_s
        broker.stop(timeout_s)
        broker.start()
        broker.wait_ready(max(0.1, deadline - time.monotonic()))
        if node_id in self._controllers:
            return
        try:
            self._wait_for_metadata(
                lambda ids: node_id in ids, f"broker {node_id}", max(0.1, deadline - time.monotonic())
            )
        except TimeoutError as e:
            raise broker.start_error(str(e)) from None

    def stop(self, timeout_s: float = 15.0) -> None:
        """Controlled shutdown of every node, each SIGKILLed if it takes longer than `timeout_s`. The brokers
        that are not controllers go first and together, the controller nodes last: a broker's controlled
        shutdown asks the controller."""
        controllers = [self.broker(node_id) for node_id in self.node_ids if "controller" in self.roles(node_id)]
        others = [self.broker(node_id) for node_id in self.node_ids if "controller" not in self.roles(node_id)]
        for group in (others, controllers):
            for broker in group:
                broker.terminate()
            for broker in group:
                broker.wait_stopped(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
