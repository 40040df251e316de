"""Kafka's classic group coordinator: groups, members, committed offsets and their __consumer_offsets records."""
