"""IncrementalAlterConfigs operations on a topic's overrides, as Kafka applies them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tierlog.controller.errors import InvalidConfigError
from tierlog.server.kafka_apis import OP_APPEND, OP_DELETE, OP_SET, OP_SUBTRACT, _apply_config_operations


def ops(*items: tuple[str, int, str | None]) -> SimpleNamespace:
    return SimpleNamespace(configs=[SimpleNamespace(name=n, config_operation=o, value=v) for n, o, v in items])


def test_set_and_delete_change_only_the_named_overrides() -> None:
    current = {"retention.ms": "1000", "segment.bytes": "2048"}
    result = _apply_config_operations(
        ops(("retention.ms", OP_DELETE, None), ("cleanup.policy", OP_SET, "compact")), current
    )
    assert result == {"segment.bytes": "2048", "cleanup.policy": "compact"}


def test_append_and_subtract_edit_list_values_without_duplicates() -> None:
    current = {"cleanup.policy": "delete"}
    appended = _apply_config_operations(ops(("cleanup.policy", OP_APPEND, "compact,delete")), current)
    assert appended["cleanup.policy"] == "delete,compact"
    subtracted = _apply_config_operations(ops(("cleanup.policy", OP_SUBTRACT, "delete")), appended)
    assert subtracted["cleanup.policy"] == "compact"


def test_unknown_operation_is_invalid_config() -> None:
    with pytest.raises(InvalidConfigError):
        _apply_config_operations(ops(("retention.ms", 9, "1")), {})
