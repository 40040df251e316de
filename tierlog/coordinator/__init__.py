"""Coordinators: the deterministic cores of Kafka's group coordinator (and, later, others)."""
