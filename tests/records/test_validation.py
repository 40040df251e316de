"""validate_records: Kafka's per-record checks name every offending record, with Kafka's messages."""

from __future__ import annotations

import pytest

from tierlog.records.codec import RawRecord
from tierlog.records.validation import RecordError, RecordValidationError, validate_records

NOW = 1_700_000_000_000
KEYLESS = "Compacted topic cannot accept message without key in topic partition events-3"


def record(offset_delta: int, key: bytes | None = b"k", timestamp: int = NOW) -> RawRecord:
    return RawRecord(offset_delta, timestamp, key, b"v", b"\x00")


def refusal(records: list[RawRecord], *, compacted: bool, bounds: tuple[int, int] | None) -> RecordValidationError:
    with pytest.raises(RecordValidationError) as refused:
        validate_records(records, "events-3", compacted=compacted, timestamp_bounds=bounds)
    return refused.value


def test_valid_records_pass() -> None:
    records = [record(0), record(1, timestamp=-1)]
    validate_records(records, "events-3", compacted=True, timestamp_bounds=(NOW - 10, NOW + 10))


def test_every_keyless_record_of_a_compacted_topic_is_named_and_the_summary_shows_three() -> None:
    records = [record(i, key=None if i % 2 else b"k") for i in range(10)]
    error = refusal(records, compacted=True, bounds=None)
    assert error.error_name == "INVALID_RECORD"
    assert error.record_errors == tuple(RecordError("INVALID_RECORD", i, KEYLESS) for i in (1, 3, 5, 7, 9))
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{KEYLESS}')" for i in (1, 3, 5))
    assert str(error) == (
        "One or more records have been rejected due to 5 record errors in total, and only showing the first "
        f"three errors at most: [{shown}]"
    )


def test_keyless_records_of_a_topic_that_is_not_compacted_pass() -> None:
    validate_records([record(0, key=None)], "events-3", compacted=False, timestamp_bounds=None)


def test_timestamps_out_of_range_are_named_with_the_range_and_make_it_invalid_timestamp() -> None:
    bounds = (NOW - 1000, NOW + 500)
    records = [record(0, timestamp=NOW - 1001), record(1), record(2, key=None), record(3, timestamp=NOW + 501)]
    error = refusal(records, compacted=True, bounds=bounds)
    # One bad timestamp makes the whole answer INVALID_TIMESTAMP, keyless records still listed.
    assert error.error_name == "INVALID_TIMESTAMP"
    assert str(error) == "One or more records have been rejected due to invalid timestamp"
    assert [(e.error_name, e.batch_index) for e in error.record_errors] == [
        ("INVALID_TIMESTAMP", 0),
        ("INVALID_RECORD", 2),
        ("INVALID_TIMESTAMP", 3),
    ]
    assert error.record_errors[0].message == (
        f"Timestamp {NOW - 1001} of message with offset 0 is out of range. The timestamp should be within "
        f"[{NOW - 1000}, {NOW + 500}]"
    )


def test_a_keyless_record_is_named_once_for_its_key_even_with_a_bad_timestamp() -> None:
    error = refusal([record(0, key=None, timestamp=0)], compacted=True, bounds=(NOW - 1, NOW + 1))
    assert error.record_errors == (RecordError("INVALID_RECORD", 0, KEYLESS),)
    assert error.error_name == "INVALID_RECORD"
