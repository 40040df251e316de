from __future__ import annotations

import pytest

from tierlog.protocol.errors import ErrorCode, error_code


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("NONE", 0),
        ("OFFSET_OUT_OF_RANGE", 1),
        ("NOT_LEADER_OR_FOLLOWER", 6),
        ("UNSUPPORTED_VERSION", 35),
        ("offset_moved_to_tiered_storage", 109),
        ("UNKNOWN_SERVER_ERROR", -1),
    ],
)
def test_kafka_names_map_to_codes(name: str, code: int) -> None:
    assert error_code(name) == code
    assert isinstance(error_code(name), ErrorCode)


def test_unknown_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="NOT_AN_ERROR"):
        error_code("NOT_AN_ERROR")
