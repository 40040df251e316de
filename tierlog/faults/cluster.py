"""A LocalCluster under a 3-voter controller quorum whose inter-broker and quorum links each pass through a
FaultProxy.

Brokers 1..3 are combined nodes (process.roles=broker,controller): the voters of the quorum, as
`LocalCluster(controllers=3, combined=True)` starts them. Every broker gets a second listener, REPLICATION,
used between brokers (`inter.broker.listener.name`) and advertised at its proxy's port, so followers fetch
from a leader through that leader's proxy. Every node reaches every other voter's CONTROLLER listener through
a proxy of its own for that one link (its `controller.quorum.voters` names the proxies; its own entry stays its
own listener): Raft's Vote, BeginQuorumEpoch, EndQuorumEpoch and Fetch between voters, and what a broker sends
the active controller on another node (registration, heartbeats, AlterPartition, forwarded admin requests) all
cross these proxies. Clients use PLAINTEXT directly; `quorum()` asks each voter's CONTROLLER listener directly.

    with ProxiedCluster(tmp_path, overrides=...) as cluster:
        cluster.replication_proxy(2).cut()      # nobody can fetch from broker 2 any more
        for proxy in cluster.quorum_links(3):   # voter 3 hears no voter and no voter hears it: if it led, the
            proxy.cut()                         # others elect a leader; its broker is fenced
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

from tierlog.client.probes import quorum_leadership
from tierlog.faults.proxy import FaultProxy
from tierlog.testing.local_cluster import CONTROLLER_LISTENER, LocalCluster, free_ports

REPLICATION_LISTENER = "REPLICATION"
VOTERS = 3
_HOST = "127.0.0.1"
# A paused voter never answers: each DescribeQuorum gets this long.
_DESCRIBE_TIMEOUT_S = 1.0


class QuorumView(NamedTuple):
    """The leader and epoch a voter that leads the quorum reports (DescribeQuorum)."""

    leader: int
    epoch: int


class ProxiedCluster(LocalCluster):
    def __init__(self, base_dir: Path, brokers: int = 3, overrides: Mapping[str, str] | None = None) -> None:
        self._replication_ports = dict(zip(range(1, brokers + 1), free_ports(brokers), strict=True))
        self._replication_proxies = {
            node_id: FaultProxy(port, f"replication-{node_id}") for node_id, port in self._replication_ports.items()
        }
        # (from node, to voter) -> the proxy in front of that voter's controller listener, for that node alone.
        self._quorum_proxies: dict[tuple[int, int], FaultProxy] = {}
        super().__init__(base_dir, brokers, overrides, controllers=VOTERS, combined=True)

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
        voters = []
        for voter, port in self.controller_ports.items():
            if voter != node_id:
                link = FaultProxy(port, f"quorum-{node_id}-to-{voter}")
                self._quorum_proxies[(node_id, voter)] = link
                port = link.port
            voters.append(f"{voter}@{_HOST}:{port}")
        settings["controller.quorum.voters"] = ",".join(voters)
        return settings

    def replication_proxy(self, node_id: int) -> FaultProxy:
        """The proxy in front of `node_id`'s inter-broker listener: cutting it stops every fetch from it."""
        return self._replication_proxies[node_id]

    def quorum_link(self, from_node: int, to_voter: int) -> FaultProxy:
        """The proxy `from_node` reaches `to_voter`'s controller listener through (one direction only)."""
        return self._quorum_proxies[(from_node, to_voter)]

    def quorum_links(self, node_id: int) -> list[FaultProxy]:
        """Every quorum link from or to `node_id`: cutting them all isolates it from the quorum both ways."""
        return [proxy for (source, target), proxy in self._quorum_proxies.items() if node_id in (source, target)]

    def quorum(self) -> QuorumView | None:
        """The leader and epoch of the newest epoch a voter claims to lead (DescribeQuorum, asked of every voter
        at once on its own listener, not through the proxies: an isolated leader may not have resigned yet);
        None while no voter leads."""
        with ThreadPoolExecutor(len(self.controller_ports)) as pool:
            claims = pool.map(
                lambda port: quorum_leadership(_HOST, port, _DESCRIBE_TIMEOUT_S), self.controller_ports.values()
            )
            views = [QuorumView(*claim) for claim in claims if claim is not None]
        return max(views, key=lambda view: view.epoch, default=None)

    @property
    def proxies(self) -> list[FaultProxy]:
        return [*self._replication_proxies.values(), *self._quorum_proxies.values()]

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
