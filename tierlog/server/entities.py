"""Build kio response entities for whatever version a client asked for.

Handlers describe a response once with every field they know, and the version's `ResponseSchema` keeps only
the fields that version has (protocol/entities.py), so one handler serves every supported version.
"""

from __future__ import annotations

import datetime
import functools
from typing import TypeAlias

from kio.index import load_payload_module
from kio.static.constants import EntityType

from tierlog.protocol.entities import EntitySchema

NO_THROTTLE = datetime.timedelta(0)

ResponseSchema: TypeAlias = EntitySchema


@functools.cache
def response_schema(api_key: int, version: int) -> ResponseSchema:
    return EntitySchema(load_payload_module(api_key, version, EntityType.response))


def timestamp_or_none(timestamp_ms: int) -> datetime.datetime | None:
    if timestamp_ms < 0:
        return None
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
