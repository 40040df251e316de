"""Deterministic simulation of a tierlog cluster (FoundationDB-style): the real core (storage, replication,
controller) runs in one process under a virtual clock, with an in-memory network and disks that lose what
was not fsynced. A seed decides every message delay, drop, fault and client choice, so `tierlog sim --seed N`
replays a failing run exactly. See docs/simulation.md.
"""
