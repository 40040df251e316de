"""What the protocol tests share: every served (api key, version), and request frames of kio entities."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tierlog.client.wire import encode_request
from tierlog.protocol.api_versions import SUPPORTED_APIS
from tierlog.protocol.framing import SIZE_PREFIX

SERVED = [
    (api.api_key, version) for api in SUPPORTED_APIS.values() for version in range(api.min_version, api.max_version + 1)
]


def kio_frame(entity: Any, correlation_id: int = 7, client_id: str | None = "kio-test") -> bytes:
    """A request frame (without its size prefix) of the kio entity `entity`, as tierlog's client writes it
    (tests/client/test_requests.py checks that against kio's own header writer)."""
    return encode_request(entity, correlation_id, client_id)[SIZE_PREFIX.size :]


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
