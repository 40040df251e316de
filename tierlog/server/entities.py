"""Build kio response entities for whatever version a client asked for.

kio generates one dataclass per API version, and fields come and go between versions. Handlers describe a
response once with every field they know, and `ResponseSchema` keeps only the fields that version has, so
one handler serves every supported version.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import fields
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.static.constants import EntityType

NO_THROTTLE = datetime.timedelta(0)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def build(cls: type, **values: Any) -> Any:
    names = _field_names(cls)
    return cls(**{name: value for name, value in values.items() if name in names})


class _Builder:
    __slots__ = ("_cls",)

    def __init__(self, cls: type | None) -> None:
        self._cls = cls

    def __call__(self, **values: Any) -> Any:
        # A nested class that this version lacks belongs to a field the version lacks too: the parent's
        # builder drops that field, so the value built here is never written.
        return None if self._cls is None else build(self._cls, **values)


class ResponseSchema:
    """`schema.MetadataResponseTopic(name=..., topic_id=...)` builds that class of this version's module."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> _Builder:
        builder = _Builder(getattr(self._module, name, None))
        setattr(self, name, builder)
        return builder


@functools.cache
def response_schema(api_key: int, version: int) -> ResponseSchema:
    return ResponseSchema(load_payload_module(api_key, version, EntityType.response))


@functools.cache
def request_schema(api_key: int, version: int) -> ResponseSchema:
    """The same builder over a request module, for the requests the broker itself sends."""
    return ResponseSchema(load_payload_module(api_key, version, EntityType.request))


def timestamp_or_none(timestamp_ms: int) -> datetime.datetime | None:
    if timestamp_ms < 0:
        return None
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
