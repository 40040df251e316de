"""Build kio entities of whatever version is wanted from one description.

kio generates one dataclass per API version, and fields come and go between versions. A caller describes an
entity once with every field it knows, and `EntitySchema` keeps only the fields that version has: the broker
answers every version it serves with one handler (server/entities.py), and the client builds every version
of a request it sends with one builder (client/requests.py).
"""

from __future__ import annotations

import functools
from dataclasses import fields
from types import ModuleType
from typing import Any


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def _build(cls: type, **values: Any) -> Any:
    names = _field_names(cls)
    return cls(**{name: value for name, value in values.items() if name in names})


class _Builder:
    __slots__ = ("_cls",)

    def __init__(self, cls: type | None) -> None:
        self._cls = cls

    def __call__(self, **values: Any) -> Any:
        # A nested class that this version lacks belongs to a field the version lacks too: the parent's
        # builder drops that field, so the value built here is never written.
        return None if self._cls is None else _build(self._cls, **values)


class EntitySchema:
    """`schema.MetadataResponseTopic(name=..., topic_id=...)` builds that class of this version's module."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> _Builder:
        builder = _Builder(getattr(self._module, name, None))
        setattr(self, name, builder)
        return builder
