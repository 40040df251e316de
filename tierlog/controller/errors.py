"""Controller-side failures, each the mirror of a Kafka error the admin APIs return."""


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


class InvalidConfigError(ControllerError):
    error_name = "INVALID_CONFIG"


class TopicDeletionDisabledError(ControllerError):
    error_name = "TOPIC_DELETION_DISABLED"
