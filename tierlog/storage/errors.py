"""Storage errors, each the Python mirror of a Kafka exception.

`error_name` is the Kafka error the server answers with (tierlog.protocol.errors maps names to codes).
Corrupt or malformed produce input raises `tierlog.records.record_batch.InvalidRecordError` instead.
"""

from __future__ import annotations

from typing import ClassVar


class StorageError(Exception):
    """Base of the storage errors; Kafka answers UNKNOWN_SERVER_ERROR for exceptions without a code."""

    error_name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"


class OffsetOutOfRangeError(StorageError):
    """Kafka's OffsetOutOfRangeException: a fetch outside [log start, LEO], or DeleteRecords above the HW."""

    error_name = "OFFSET_OUT_OF_RANGE"


class RecordTooLargeError(StorageError):
    """Kafka's RecordTooLargeException: a batch larger than max.message.bytes."""

    error_name = "MESSAGE_TOO_LARGE"


class RecordBatchTooLargeError(StorageError):
    """Kafka's RecordBatchTooLargeException: an append larger than segment.bytes."""

    error_name = "RECORD_LIST_TOO_LARGE"


class InvalidTimestampError(StorageError):
    """Kafka's InvalidTimestampException: outside message.timestamp.before/after.max.ms of the broker's time."""

    error_name = "INVALID_TIMESTAMP"


class KafkaStorageError(StorageError):
    """Kafka's KafkaStorageException: an I/O error on the log directory."""

    error_name = "KAFKA_STORAGE_ERROR"


class PolicyViolationError(StorageError):
    """Kafka's PolicyViolationException, e.g. DeleteRecords on a topic whose cleanup.policy lacks delete."""

    error_name = "POLICY_VIOLATION"


class InconsistentTopicIdError(StorageError):
    """Kafka's InconsistentTopicIdException: partition.metadata names another topic id."""

    error_name = "INCONSISTENT_TOPIC_ID"


class InvalidOffsetError(StorageError):
    """Kafka's InvalidOffsetException: an index entry that does not move forward."""


class UnexpectedAppendOffsetError(StorageError):
    """Kafka's UnexpectedAppendOffsetException: a follower append that starts below the log end offset."""

    def __init__(self, message: str, first_offset: int, last_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.last_offset = last_offset


class OffsetsOutOfOrderError(StorageError):
    """Kafka's OffsetsOutOfOrderException: a follower append whose batches' offsets go backwards."""


class LogSegmentOffsetOverflowError(StorageError):
    """Kafka's LogSegmentOffsetOverflowException: an offset too far from the segment base for int32 indexes."""


class CorruptIndexError(StorageError):
    """Kafka's CorruptIndexException: an index file that cannot describe its log; recovery rebuilds it."""


class OffsetMovedToTieredStorageError(OffsetOutOfRangeError):
    """The offset is within the log but below the local log start: it lives only in the remote tier.
    Consumers are served from there; followers get this error and rebuild their state
    (docs/tiered-storage.md#remote-read)."""

    error_name = "OFFSET_MOVED_TO_TIERED_STORAGE"


class OutOfOrderSequenceError(StorageError):
    """Kafka's OutOfOrderSequenceException: an idempotent producer's batch does not continue its sequence."""

    error_name = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class InvalidProducerEpochError(StorageError):
    """Kafka's InvalidProducerEpochException: a batch from an older epoch of the producer than the log has seen."""

    error_name = "INVALID_PRODUCER_EPOCH"


class TransactionCoordinatorFencedError(StorageError):
    """Kafka's TransactionCoordinatorFencedException: a transaction marker from a coordinator epoch older than the
    last one the partition heard from about the producer (a zombie coordinator)."""

    error_name = "TRANSACTION_COORDINATOR_FENCED"


class InvalidTxnStateError(StorageError):
    """Kafka's InvalidTxnStateException: a non-transactional batch from a producer with an ongoing transaction."""

    error_name = "INVALID_TXN_STATE"
