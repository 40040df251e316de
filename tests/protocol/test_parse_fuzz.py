"""Property tests: whatever the bytes, parse_request raises only InvalidRequest or UnsupportedVersion, and
the tolerant (unknown-tag-skipping) reader reads every served request schema exactly like kio's own."""

from __future__ import annotations

import contextlib
import io
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records
from protocol_helpers import SERVED, edits, kio_frame, mutate

from tierlog.protocol.codec import InvalidRequest, UnsupportedVersion, parse_request
from tierlog.protocol.tolerant_reader import tolerant_entity_reader

# kio registers strategies for its primitive types, not for its records blob.
st.register_type_strategy(Records, st.binary(max_size=64))


def parse_only_expected_errors(frame: bytes) -> None:
    with contextlib.suppress(InvalidRequest, UnsupportedVersion):
        parse_request(frame)


def kio_reads_back(entity: Any) -> bool:
    """kio writes some values its own reader refuses: a timedelta beyond Python's range (retention_time near
    Int64.MAX ms). Such a frame is malformed for every reader, so it is no valid frame to start from."""
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    try:
        entity_reader(type(entity))(memoryview(out.getvalue()), 0)
    except ValueError:
        return False
    return True


@st.composite
def served_entities(draw: st.DrawFn) -> Any:
    api_key, version = draw(st.sampled_from(SERVED))
    return draw(st.from_type(load_request_schema(api_key, version)).filter(kio_reads_back))


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_random_bytes(frame: bytes) -> None:
    parse_only_expected_errors(frame)


@settings(max_examples=1000)
@given(st.sampled_from(SERVED), st.integers(min_value=-(2**31), max_value=2**31 - 1), st.binary(max_size=300))
def test_random_bodies_behind_a_served_header(api: tuple[int, int], correlation_id: int, rest: bytes) -> None:
    parse_only_expected_errors(struct.pack(">hhi", *api, correlation_id) + rest)


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(served_entities(), st.lists(edits, min_size=1, max_size=4))
def test_mutated_valid_frames(entity: Any, edits: list[tuple[str, int, int]]) -> None:
    frame = kio_frame(entity)
    assert parse_request(frame).body == entity
    parse_only_expected_errors(mutate(frame, edits))


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_tolerant_reader_reads_like_kio(api_key: int, version: int) -> None:
    request_type = load_request_schema(api_key, version)
    native = entity_reader(request_type)
    tolerant = tolerant_entity_reader(request_type)

    @settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.from_type(request_type))
    def check(entity: Any) -> None:
        out = io.BytesIO()
        entity_writer(request_type)(out, entity)
        data = memoryview(out.getvalue()).toreadonly()
        try:
            expected = native(data, 0)
        except ValueError as refused:
            # kio writes what its reader refuses: a timedelta beyond Python's range (retention_time near
            # Int64.MAX ms). The tolerant reader must refuse it alike, which the broker answers as malformed.
            with pytest.raises(type(refused)):
                tolerant(data, 0)
            return
        assert tolerant(data, 0) == expected == (entity, len(data))

    check()
