"""Kafka error codes: kio's `ErrorCode` enum, reachable by Kafka's own names.

Kafka's `Errors` enum and its docs say OFFSET_OUT_OF_RANGE; kio's members are the same names in lower
case (`ErrorCode.offset_out_of_range`). `error_code` accepts either spelling, so code and configuration
can quote Kafka verbatim.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "error_code"]


def error_code(name: str | None) -> ErrorCode:
    """`error_code("OFFSET_OUT_OF_RANGE") is ErrorCode.offset_out_of_range`, None is NONE; ValueError if unknown."""
    if name is None:
        return ErrorCode.none
    try:
        return ErrorCode[name.lower()]
    except KeyError:
        raise ValueError(f"unknown Kafka error name: {name!r}") from None
