"""Controller-side failures, each the mirror of a Kafka error the admin and controller APIs return."""


class ControllerError(Exception):
    error_name = "UNKNOWN_SERVER_ERROR"


class TopicExistsError(ControllerError):
    error_name = "TOPIC_ALREADY_EXISTS"


class InvalidTopicError(ControllerError):
    error_name = "INVALID_TOPIC_EXCEPTION"


class UnknownTopicError(ControllerError):
    error_name = "UNKNOWN_TOPIC_OR_PARTITION"


class InvalidPartitionsError(ControllerError):
    error_name = "INVALID_PARTITIONS"


class InvalidReplicationFactorError(ControllerError):
    error_name = "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignmentError(ControllerError):
    error_name = "INVALID_REPLICA_ASSIGNMENT"


class InvalidConfigError(ControllerError):
    error_name = "INVALID_CONFIG"


class TopicDeletionDisabledError(ControllerError):
    error_name = "TOPIC_DELETION_DISABLED"


class UnknownTopicIdError(ControllerError):
    error_name = "UNKNOWN_TOPIC_ID"


class InvalidRequestError(ControllerError):
    error_name = "INVALID_REQUEST"


class InconsistentClusterIdError(ControllerError):
    error_name = "INCONSISTENT_CLUSTER_ID"


class BrokerIdNotRegisteredError(ControllerError):
    error_name = "BROKER_ID_NOT_REGISTERED"


class StaleBrokerEpochError(ControllerError):
    error_name = "STALE_BROKER_EPOCH"


class NotLeaderOrFollowerError(ControllerError):
    error_name = "NOT_LEADER_OR_FOLLOWER"


class FencedLeaderEpochError(ControllerError):
    error_name = "FENCED_LEADER_EPOCH"


class InvalidUpdateVersionError(ControllerError):
    error_name = "INVALID_UPDATE_VERSION"


class IneligibleReplicaError(ControllerError):
    error_name = "INELIGIBLE_REPLICA"


class NotControllerError(ControllerError):
    """This node's controller is not (or no longer) the active one: the caller retries on the active controller
    (docs/quorum.md#active-controller)."""

    error_name = "NOT_CONTROLLER"


class NoReassignmentInProgressError(ControllerError):
    error_name = "NO_REASSIGNMENT_IN_PROGRESS"
