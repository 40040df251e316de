"""The request body reader: kio entities read field by field, skipping unknown tagged fields (KIP-482)
and refusing any length the buffer cannot hold.

kio 0.6.5's native entity reader raises KeyError on an unknown tag and sizes arrays by the length a frame
claims before reading them, so a few forged bytes make it allocate tens of gigabytes and abort the
process. This reader walks the entity's dataclass fields like kio's writer does, reads every primitive
with kio's own native field readers, bounds every array length by the bytes left before reading it, and
assembles structs and struct arrays itself, so only the structure walk is Python. Unknown tags are
skipped by their declared size; known tags are read inside exactly that size.

Every reader returns `(value, bytes consumed)`, the convention of kio's native readers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from functools import cache
from typing import Any, TypeAlias

from kio._kio_native import get_field_reader
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

Reader: TypeAlias = Callable[[memoryview, int], tuple[Any, int]]

_INT8 = struct.Struct(">b")
_INT32 = struct.Struct(">i")
_MAX_UVARINT_BYTES = 5


class MalformedEntity(ValueError):
    """The bytes do not encode an entity of the expected schema."""


def read_uvarint(buffer: memoryview, offset: int) -> tuple[int, int]:
    """An unsigned varint (at most 5 bytes, as Kafka's ByteUtils.readUnsignedVarint allows)."""
    value = 0
    for index in range(_MAX_UVARINT_BYTES):
        if offset + index >= len(buffer):
            raise MalformedEntity("buffer ends inside a varint")
        byte = buffer[offset + index]
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, index + 1
    raise MalformedEntity("varint longer than 5 bytes")


def tagged_fields(buffer: memoryview, offset: int) -> tuple[list[tuple[int, int, int]], int]:
    """The tagged-field section at `offset`: each field's (tag, start, end) of its value, and where the section
    ends."""
    count, position = read_uvarint(buffer, offset)
    position += offset
    spans = []
    for _ in range(count):
        tag, consumed = read_uvarint(buffer, position)
        position += consumed
        size, consumed = read_uvarint(buffer, position)
        position += consumed
        end = position + size
        if end > len(buffer):
            raise MalformedEntity(f"tagged field {tag} runs past the end of the buffer")
        spans.append((tag, position, end))
        position = end
    return spans, position


def skip_tagged_fields(buffer: memoryview, offset: int) -> int:
    """Skip a whole tagged-field section (used for request header v2, which defines no tags)."""
    _, end = tagged_fields(buffer, offset)
    return end - offset


@cache
def tolerant_entity_reader(entity_type: type[Any]) -> Reader:
    """A reader for `entity_type` (a kio dataclass) that skips unknown tagged fields."""
    flexible: bool = entity_type.__flexible__
    plain: list[tuple[str, Reader]] = []
    tagged: dict[int, tuple[str, Reader]] = {}
    # Tagged fields absent from the wire take their default; kio leaves some defaults implicit.
    implicit_defaults: dict[str, Any] = {}
    for field in fields(entity_type):
        tag = get_field_tag(field)
        reader = _field_reader(entity_type, field, flexible, is_tag=tag is not None)
        if tag is None:
            plain.append((field.name, reader))
            continue
        tagged[tag] = (field.name, reader)
        if field.default is MISSING and field.default_factory is MISSING:
            implicit_defaults[field.name] = get_tagged_field_default(field)

    def read_entity(buffer: memoryview, offset: int) -> tuple[Any, int]:
        position = offset
        values: dict[str, Any] = {}
        for name, reader in plain:
            values[name], consumed = reader(buffer, position)
            position += consumed
        if flexible:
            spans, position = tagged_fields(buffer, position)
            for tag, start, end in spans:
                known = tagged.get(tag)
                if known is not None:
                    name, reader = known
                    values[name], consumed = reader(buffer[:end], start)
                    if consumed != end - start:
                        raise MalformedEntity(f"tagged field {tag} declares {end - start} bytes, holds {consumed}")
            for name, default in implicit_defaults.items():
                values.setdefault(name, default)
        return entity_type(**values), position - offset

    return read_entity


def _field_reader(entity_type: type[Any], field: Field[Any], flexible: bool, *, is_tag: bool) -> Reader:
    field_class = classify_field(field)
    if isinstance(field_class, PrimitiveField):
        native: Reader = get_field_reader(entity_type, field, False, is_tag)
        return native
    if isinstance(field_class, PrimitiveTupleField):
        read_native = get_field_reader(entity_type, field, False, is_tag)
        return _bounded_primitive_array_reader(read_native, flexible, field.name)
    item_reader = tolerant_entity_reader(field_class.type_)
    # Tagged fields are optional by their presence, never by a null marker (as in kio's writer).
    nullable = not is_tag and is_optional(field)
    if isinstance(field_class, EntityField):
        return _nullable_struct_reader(item_reader) if nullable else item_reader
    assert isinstance(field_class, EntityTupleField)
    return _array_reader(item_reader, flexible=flexible, nullable=nullable, name=field.name)


def _bounded_primitive_array_reader(read_native: Reader, flexible: bool, name: str) -> Reader:
    """kio's native reader allocates whatever length an array claims before reading it: a few bytes claiming
    billions of items abort the process. Check the length here first, then let kio read the items."""

    def read_array(buffer: memoryview, offset: int) -> tuple[Any, int]:
        _read_array_length(buffer, offset, flexible, name)
        value: tuple[Any, int] = read_native(buffer, offset)
        return value

    return read_array


def _read_array_length(buffer: memoryview, offset: int, flexible: bool, name: str) -> tuple[int, int]:
    """(item count, bytes of the length field); -1 is null. A count the rest of the buffer cannot hold (every
    item takes at least one byte) is refused before anything is allocated for it."""
    if flexible:
        length, size = read_uvarint(buffer, offset)
        count = length - 1
    else:
        if offset + 4 > len(buffer):
            raise MalformedEntity(f"buffer ends inside the length of {name}")
        (count,) = _INT32.unpack_from(buffer, offset)
        size = 4
    remaining = len(buffer) - offset - size
    if count > remaining:
        raise MalformedEntity(f"array {name} claims {count} items, {remaining} bytes remain")
    return count, size


def _nullable_struct_reader(read_struct: Reader) -> Reader:
    # KIP-893: an int8 marker precedes a nullable struct; negative means null.
    def read_nullable(buffer: memoryview, offset: int) -> tuple[Any, int]:
        if offset >= len(buffer):
            raise MalformedEntity("buffer ends before a struct marker")
        (marker,) = _INT8.unpack_from(buffer, offset)
        if marker < 0:
            return None, 1
        value, consumed = read_struct(buffer, offset + 1)
        return value, consumed + 1

    return read_nullable


def _array_reader(read_item: Reader, *, flexible: bool, nullable: bool, name: str) -> Reader:
    def read_array(buffer: memoryview, offset: int) -> tuple[Any, int]:
        count, size = _read_array_length(buffer, offset, flexible, name)
        position = offset + size
        if count < 0:
            if nullable and count == -1:
                return None, size
            raise MalformedEntity(f"invalid length {count} for array {name}")
        items = []
        for _ in range(count):
            item, consumed = read_item(buffer, position)
            items.append(item)
            position += consumed
        return tuple(items), position - offset

    return read_array
