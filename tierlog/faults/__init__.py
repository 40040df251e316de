"""Jepsen-style fault runs against a real multi-process cluster: fault-injecting proxies on the inter-broker
and controller links, a workload of real Kafka clients recording a history, a seeded nemesis (SIGKILL,
SIGSTOP/SIGCONT, network cuts) and a checker of that history. See docs/simulation.md ("Real cluster")."""
