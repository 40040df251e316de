"""Compiled loops over RecordBatch v2 bytes for the Arrow converter (tierlog.spark.arrow).

A record's fields are varints and length-prefixed bytes, so where record i+1 starts is known only once record i
is read: the walk is sequential and cannot be vectorised with numpy. numba compiles these loops to machine code
(cache=True: once per installation, then loaded from __pycache__ by every Spark Python worker), and they write
straight into numpy arrays that become the Arrow buffers, with no Python object per record.

The kernels report a malformed batch by a status code (and the section it is in) rather than raising, so that
the converter can name the batch in one InvalidRecordError, as Kafka's consumers do.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OK = 0
RUNS_PAST_END = 1
VARINT_TOO_LONG = 2
NEGATIVE_RECORD_COUNT = 3
NEGATIVE_HEADER_COUNT = 4
NULL_HEADER_KEY = 5
HEADER_KEY_NOT_UTF8 = 6
RECORD_LENGTH_MISMATCH = 7
BYTES_AFTER_LAST_RECORD = 8
# What each status but OK says of the batch, `index` the record (or the trailing bytes' count).
PROBLEMS = {
    RUNS_PAST_END: "record {index} runs past the end of the records",
    VARINT_TOO_LONG: "record {index} has a varint longer than 10 bytes",
    NEGATIVE_RECORD_COUNT: "negative record count",
    NEGATIVE_HEADER_COUNT: "record {index} has a negative header count",
    NULL_HEADER_KEY: "record {index} has a header with a null key",
    HEADER_KEY_NOT_UTF8: "record {index} has a header key that is not UTF-8",
    RECORD_LENGTH_MISMATCH: "record {index} does not end where its length says",
    BYTES_AFTER_LAST_RECORD: "bytes follow the last record ({index} of them)",
}

# Smallest encodings: a record is a length, attributes, timestamp delta, offset delta, key length, value length
# and header count (one byte each at least); a header is a key length and a value length.
MIN_RECORD_BYTES = 7
MIN_HEADER_BYTES = 2

_RECORD_BATCH_OVERHEAD = 61
_LOG_OVERHEAD = 12
_LENGTH_OFFSET = 8


@njit(cache=True)
def batch_spans(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position and size of every complete batch in `buf`, as record_batch.complete_batches walks them (a
    partial batch at the end ends the walk). A size below the 61-byte header is returned as it is, for the
    caller to reject."""
    count = 0
    position = 0
    length = len(buf)
    positions = np.empty(length // _RECORD_BATCH_OVERHEAD + 1, np.int64)
    sizes = np.empty(length // _RECORD_BATCH_OVERHEAD + 1, np.int64)
    while length - position >= _LOG_OVERHEAD:
        size = _LOG_OVERHEAD
        for i in range(4):
            size += np.int64(buf[position + _LENGTH_OFFSET + i]) << (8 * (3 - i))
        if size >= _LOG_OVERHEAD + 2**31:  # the int32 batchLength was negative
            size -= 2**32
        if size > length - position:
            break
        positions[count] = position
        sizes[count] = size
        count += 1
        if size < _RECORD_BATCH_OVERHEAD:
            break  # corrupt: the walk cannot go on, and the caller says so
        position += size
    return positions[:count], sizes[:count]


@njit(cache=True)
def _varint(buf: np.ndarray, position: int, end: int) -> tuple[int, int, int]:
    """A zigzag varint/varlong (Kafka's ByteUtils.readVarlong) at `position`: (value, next position, status)."""
    result = np.int64(0)
    shift = 0
    while True:
        if position >= end:
            return 0, position, RUNS_PAST_END
        byte = np.int64(buf[position])
        position += 1
        result |= (byte & 0x7F) << shift
        if byte & 0x80 == 0:
            break
        shift += 7
        if shift > 63:
            return 0, position, VARINT_TOO_LONG
    # Logical shift of the unsigned 64-bit zigzag value, then its sign.
    return ((result >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(result & 1), position, OK


@njit(cache=True)
def _nullable_bytes(buf: np.ndarray, position: int, end: int) -> tuple[int, int, int, int]:
    """A varint length and that many bytes (none for -1, null) at `position`: (length, where the bytes start,
    next position, status)."""
    length, position, status = _varint(buf, position, end)
    if status != OK:
        return 0, position, position, status
    if length > end - position:
        return 0, position, position, RUNS_PAST_END
    return length, position, position + max(length, 0), OK


@njit(cache=True)
def _is_utf8(buf: np.ndarray, position: int, end: int) -> bool:
    """Strict UTF-8 (as Python's bytes.decode): no overlong forms, surrogates or code points above U+10FFFF."""
    while position < end:
        lead = buf[position]
        position += 1
        if lead < 0x80:
            continue
        low, high = 0x80, 0xBF  # the range of the byte after the lead
        if 0xC2 <= lead <= 0xDF:
            following = 1
        elif 0xE0 <= lead <= 0xEF:
            following = 2
            if lead == 0xE0:
                low = 0xA0
            elif lead == 0xED:
                high = 0x9F
        elif 0xF0 <= lead <= 0xF4:
            following = 3
            if lead == 0xF0:
                low = 0x90
            elif lead == 0xF4:
                high = 0x8F
        else:
            return False
        if end - position < following or not low <= buf[position] <= high:
            return False
        for i in range(1, following):
            if not 0x80 <= buf[position + i] <= 0xBF:
                return False
        position += following
    return True


@njit(cache=True)
def decode_sections(
    buf: np.ndarray,
    section_starts: np.ndarray,
    section_ends: np.ndarray,
    base_offsets: np.ndarray,
    base_timestamps: np.ndarray,
    log_append_times: np.ndarray,
    max_timestamps: np.ndarray,
    records_counts: np.ndarray,
    start_offset: int,
    end_offset: int,
    include_headers: bool,
    offsets: np.ndarray,
    timestamps: np.ndarray,
    timestamp_types: np.ndarray,
    key_valid: np.ndarray,
    key_offsets: np.ndarray,
    key_data: np.ndarray,
    value_valid: np.ndarray,
    value_offsets: np.ndarray,
    value_data: np.ndarray,
    header_offsets: np.ndarray,
    header_key_offsets: np.ndarray,
    header_key_data: np.ndarray,
    header_value_valid: np.ndarray,
    header_value_offsets: np.ndarray,
    header_value_data: np.ndarray,
) -> tuple[int, int, int, int]:
    """Read the records of each records section buf[section_starts[s]:section_ends[s]] (uncompressed, the
    records of one batch) and append those with offsets in [start_offset, end_offset) to the output arrays:
    one row each (Arrow offsets for key, value and the headers list) and, with include_headers, one entry
    per header. A null key, value or header value (length -1) is a row with its valid flag 0 and no bytes.

    Returns (status, section, record index in it, rows). The output arrays must hold every record and byte
    the sections can hold: a record takes MIN_RECORD_BYTES at least, a header MIN_HEADER_BYTES."""
    row = 0
    key_bytes = 0
    value_bytes = 0
    headers = 0
    header_key_bytes = 0
    header_value_bytes = 0
    key_offsets[0] = 0
    value_offsets[0] = 0
    header_offsets[0] = 0
    if include_headers:
        header_key_offsets[0] = 0
        header_value_offsets[0] = 0
    for section in range(len(section_starts)):
        position = section_starts[section]
        end = section_ends[section]
        base_offset = base_offsets[section]
        if records_counts[section] < 0:
            return NEGATIVE_RECORD_COUNT, section, 0, row
        for index in range(records_counts[section]):
            length, position, status = _varint(buf, position, end)
            if status != OK:
                return status, section, index, row
            record_start = position
            if position >= end:
                return RUNS_PAST_END, section, index, row
            position += 1  # attributes: one byte, unused
            timestamp_delta, position, status = _varint(buf, position, end)
            if status != OK:
                return status, section, index, row
            offset_delta, position, status = _varint(buf, position, end)
            if status != OK:
                return status, section, index, row
            key_length, key_start, position, status = _nullable_bytes(buf, position, end)
            if status != OK:
                return status, section, index, row
            value_length, value_start, position, status = _nullable_bytes(buf, position, end)
            if status != OK:
                return status, section, index, row
            header_count, position, status = _varint(buf, position, end)
            if status != OK:
                return status, section, index, row
            if header_count < 0:
                return NEGATIVE_HEADER_COUNT, section, index, row
            offset = base_offset + offset_delta
            keep = start_offset <= offset < end_offset
            for _ in range(header_count):
                header_key_length, position, status = _varint(buf, position, end)
                if status != OK:
                    return status, section, index, row
                if header_key_length < 0:
                    return NULL_HEADER_KEY, section, index, row
                if header_key_length > end - position:
                    return RUNS_PAST_END, section, index, row
                header_key_start = position
                position += header_key_length
                # Header keys are strings: every record's, kept or not, must decode (as aiokafka's reader did).
                if not _is_utf8(buf, header_key_start, position):
                    return HEADER_KEY_NOT_UTF8, section, index, row
                header_value_length, header_value_start, position, status = _nullable_bytes(buf, position, end)
                if status != OK:
                    return status, section, index, row
                if keep and include_headers:
                    header_key_data[header_key_bytes : header_key_bytes + header_key_length] = buf[
                        header_key_start : header_key_start + header_key_length
                    ]
                    header_key_bytes += header_key_length
                    header_key_offsets[headers + 1] = header_key_bytes
                    header_value_valid[headers] = header_value_length >= 0
                    if header_value_length > 0:
                        header_value_data[header_value_bytes : header_value_bytes + header_value_length] = buf[
                            header_value_start:position
                        ]
                        header_value_bytes += header_value_length
                    header_value_offsets[headers + 1] = header_value_bytes
                    headers += 1
            if position - record_start != length:
                return RECORD_LENGTH_MISMATCH, section, index, row
            if not keep:
                continue
            offsets[row] = offset
            if log_append_times[section]:
                # The broker stamps the batch's max timestamp and leaves the records' deltas as the producer
                # wrote them; the batch's time is every record's time.
                timestamps[row] = max_timestamps[section]
                timestamp_types[row] = 1
            else:
                timestamps[row] = base_timestamps[section] + timestamp_delta
                timestamp_types[row] = 0
            key_valid[row] = key_length >= 0
            if key_length > 0:
                key_data[key_bytes : key_bytes + key_length] = buf[key_start : key_start + key_length]
                key_bytes += key_length
            key_offsets[row + 1] = key_bytes
            value_valid[row] = value_length >= 0
            if value_length > 0:
                value_data[value_bytes : value_bytes + value_length] = buf[value_start : value_start + value_length]
                value_bytes += value_length
            value_offsets[row + 1] = value_bytes
            header_offsets[row + 1] = headers
            row += 1
        if position != end:
            return BYTES_AFTER_LAST_RECORD, section, end - position, row
    return OK, 0, 0, row
