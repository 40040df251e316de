"""Kafka's LogValidator checks of single records, with the answer Kafka gives for them (KIP-467).

A record a leader refuses fails its whole batch, but Kafka names every offending record: the produce
response (v8+) lists each one's index in the batch and reason in `record_errors`, and sums them up in
`error_message`. librdkafka fails exactly the listed messages with that reason and the rest of the batch
with _INVALID_DIFFERENT_RECORD. The messages are Kafka 3.5+'s, word for word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tierlog.records.codec import RawRecord
from tierlog.records.record_batch import NO_TIMESTAMP

INVALID_RECORD = "INVALID_RECORD"
INVALID_TIMESTAMP = "INVALID_TIMESTAMP"


@dataclass(frozen=True, slots=True)
class RecordError:
    """One refused record: the Kafka error it earns, its index in the batch and why."""

    error_name: str
    batch_index: int
    message: str

    def __str__(self) -> str:
        # Kafka's ProduceResponse.RecordError.toString, which its summary message quotes.
        return f"RecordError(batchIndex={self.batch_index}, message='{self.message}')"


class RecordValidationError(ValueError):
    """Kafka's RecordValidationException: the batch is refused for `record_errors`. The error is
    INVALID_TIMESTAMP if any record has a bad timestamp, else INVALID_RECORD, with Kafka's summary message."""

    def __init__(self, record_errors: Sequence[RecordError]) -> None:
        self.record_errors = tuple(record_errors)
        if any(e.error_name == INVALID_TIMESTAMP for e in self.record_errors):
            self.error_name = INVALID_TIMESTAMP
            message = "One or more records have been rejected due to invalid timestamp"
        else:
            self.error_name = INVALID_RECORD
            shown = ", ".join(str(e) for e in self.record_errors[:3])
            message = (
                f"One or more records have been rejected due to {len(self.record_errors)} record errors in total, "
                f"and only showing the first three errors at most: [{shown}]"
            )
        super().__init__(message)


def validate_records(
    records: Sequence[RawRecord],
    topic_partition: str,
    *,
    compacted: bool,
    timestamp_bounds: tuple[int, int] | None,
) -> None:
    """LogValidator.validateRecord for every record of one client batch (whose base offset is 0, so a
    record's offset is its offset delta): a compacted topic needs a key, and a CreateTime timestamp must lie
    within `timestamp_bounds` (None: not checked, as for LogAppendTime topics). Raises RecordValidationError
    naming every record that fails, each for its first failure (the key is checked first)."""
    errors = []
    for index, record in enumerate(records):
        if compacted and record.key is None:
            errors.append(
                RecordError(
                    INVALID_RECORD,
                    index,
                    f"Compacted topic cannot accept message without key in topic partition {topic_partition}",
                )
            )
        elif timestamp_bounds is not None and record.timestamp != NO_TIMESTAMP:
            low, high = timestamp_bounds
            if not low <= record.timestamp <= high:
                errors.append(
                    RecordError(
                        INVALID_TIMESTAMP,
                        index,
                        f"Timestamp {record.timestamp} of message with offset {record.offset_delta} is out of "
                        f"range. The timestamp should be within [{low}, {high}]",
                    )
                )
    if errors:
        raise RecordValidationError(errors)
