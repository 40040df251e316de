"""Replication-side failures, each the mirror of the Kafka error a client receives."""


class ReplicationError(Exception):
    error_name = "UNKNOWN_SERVER_ERROR"


class UnknownTopicOrPartitionError(ReplicationError):
    error_name = "UNKNOWN_TOPIC_OR_PARTITION"


class NotLeaderOrFollowerError(ReplicationError):
    error_name = "NOT_LEADER_OR_FOLLOWER"


class FencedLeaderEpochError(ReplicationError):
    error_name = "FENCED_LEADER_EPOCH"


class UnknownLeaderEpochError(ReplicationError):
    error_name = "UNKNOWN_LEADER_EPOCH"


class NotEnoughReplicasError(ReplicationError):
    error_name = "NOT_ENOUGH_REPLICAS"


class InvalidRequiredAcksError(ReplicationError):
    error_name = "INVALID_REQUIRED_ACKS"
