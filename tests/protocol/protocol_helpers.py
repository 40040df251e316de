"""What the protocol tests share: every served (api key, version), and request frames written by kio."""

from __future__ import annotations

import io
from typing import Any

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
