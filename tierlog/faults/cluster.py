"""A LocalCluster whose inter-broker and broker-to-controller links each pass through a FaultProxy.

Every broker gets a second listener, REPLICATION, used between brokers (`inter.broker.listener.name`) and
advertised at its proxy's port, so followers fetch from a leader through that leader's proxy; brokers 2..N
reach the controller (on node 1) through a proxy of their own. Clients use PLAINTEXT directly.

    with ProxiedCluster(tmp_path, overrides=...) as cluster:
        cluster.replication_proxy(2).cut()      # nobody can fetch from broker 2 any more
        cluster.controller_proxy(3).cut()       # broker 3's heartbeats stop: it will be fenced
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from tierlog.faults.proxy import FaultProxy
from tierlog.testing.local_cluster import CONTROLLER_LISTENER, CONTROLLER_NODE_ID, LocalCluster, free_ports

REPLICATION_LISTENER = "REPLICATION"
_HOST = "127.0.0.1"


class ProxiedCluster(LocalCluster):
    def __init__(self, base_dir: Path, brokers: int = 3, overrides: Mapping[str, str] | None = None) -> None:
        self._replication_ports = dict(zip(range(1, brokers + 1), free_ports(brokers), strict=True))
        self._replication_proxies = {
            node_id: FaultProxy(port, f"replication-{node_id}") for node_id, port in self._replication_ports.items()
        }
        self._controller_proxies: dict[int, FaultProxy] = {}
        super().__init__(base_dir, brokers, overrides)

    def _node_settings(self, node_id: int) -> dict[str, str]:
        settings = super()._node_settings(node_id)
        client = f"PLAINTEXT://{_HOST}:{self._kafka_ports[node_id]}"
        settings["listeners"] += f",{REPLICATION_LISTENER}://{_HOST}:{self._replication_ports[node_id]}"
        proxy = self._replication_proxies[node_id]
        settings["advertised.listeners"] = f"{client},{REPLICATION_LISTENER}://{_HOST}:{proxy.port}"
        settings["inter.broker.listener.name"] = REPLICATION_LISTENER
        # A listener name of one's own needs its security protocol, as in Kafka.
        settings["listener.security.protocol.map"] = (
            f"PLAINTEXT:PLAINTEXT,{REPLICATION_LISTENER}:PLAINTEXT,{CONTROLLER_LISTENER}:PLAINTEXT"
        )
        if node_id != CONTROLLER_NODE_ID:
            controller = FaultProxy(self.controller_ports[CONTROLLER_NODE_ID], f"controller-link-{node_id}")
            self._controller_proxies[node_id] = controller
            settings["controller.quorum.voters"] = f"{CONTROLLER_NODE_ID}@{_HOST}:{controller.port}"
        return settings

    def replication_proxy(self, node_id: int) -> FaultProxy:
        """The proxy in front of `node_id`'s inter-broker listener: cutting it stops every fetch from it."""
        return self._replication_proxies[node_id]

    def controller_proxy(self, node_id: int) -> FaultProxy:
        """The proxy on `node_id`'s link to the controller (not for node 1, which hosts it)."""
        return self._controller_proxies[node_id]

    @property
    def proxies(self) -> list[FaultProxy]:
        return [*self._replication_proxies.values(), *self._controller_proxies.values()]

    def heal_network(self) -> None:
        for proxy in self.proxies:
            proxy.heal()

    def stop(self, timeout_s: float = 15.0) -> None:
        self.heal_network()
        super().stop(timeout_s)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            for proxy in self.proxies:
                proxy.close()
