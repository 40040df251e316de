"""What the protocol tests share: every served (api key, version), and request frames written by kio."""

from __future__ import annotations

import io
from typing import Any

from hypothesis import strategies as st
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from tierlog.protocol.api_versions import SUPPORTED_APIS

SERVED = [
    (api.api_key, version) for api in SUPPORTED_APIS.values() for version in range(api.min_version, api.max_version + 1)
]


def kio_frame(entity: Any, correlation_id: int = 7, client_id: str | None = "kio-test") -> bytes:
    """A request frame (without its size prefix): the header version kio assigns to `entity`, then the body."""
    header_type = entity.__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(
        out,
        header_type(
            request_api_key=i16(entity.__api_key__),
            request_api_version=i16(entity.__version__),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


# Byte edits for fuzzing a frame: (kind, where, value), applied in order by `mutate`.
Edit = tuple[str, int, int]
edits = st.one_of(
    st.tuples(st.just("flip"), st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
    st.tuples(st.just("truncate"), st.integers(min_value=0), st.just(0)),
    st.tuples(st.just("insert"), st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
    st.tuples(st.just("delete"), st.integers(min_value=0), st.just(0)),
)


def mutate(frame: bytes, edit_list: list[Edit]) -> bytes:
    data = bytearray(frame)
    for kind, where, value in edit_list:
        position = where % (len(data) + 1)
        if kind == "flip" and position < len(data):
            data[position] ^= value
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data.insert(position, value)
        elif kind == "delete" and position < len(data):
            del data[position]
    return bytes(data)
