"""IncrementalAlterConfigs operations on a resource's configs, as Kafka's prepareIncrementalConfigs applies them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tierlog.config import BROKER_CONFIGS
from tierlog.server.config_apis import (
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    ConfigRequestError,
    apply_config_operations,
)
from tierlog.storage.log_config import ALL_TOPIC_CONFIGS


def ops(*items: tuple[str, int, str | None]) -> SimpleNamespace:
    return SimpleNamespace(configs=[SimpleNamespace(name=n, config_operation=o, value=v) for n, o, v in items])


def test_set_and_delete_change_only_the_named_overrides() -> None:
    current = {"retention.ms": "1000", "segment.bytes": "2048"}
    result = apply_config_operations(
        ops(("retention.ms", OP_DELETE, None), ("cleanup.policy", OP_SET, "compact")), current, ALL_TOPIC_CONFIGS
    )
    assert result == {"segment.bytes": "2048", "cleanup.policy": "compact"}


def test_append_and_subtract_edit_list_values_without_duplicates() -> None:
    current = {"cleanup.policy": "delete"}
    appended = apply_config_operations(ops(("cleanup.policy", OP_APPEND, "compact,delete")), current, ALL_TOPIC_CONFIGS)
    assert appended["cleanup.policy"] == "delete,compact"
    subtracted = apply_config_operations(ops(("cleanup.policy", OP_SUBTRACT, "delete")), appended, ALL_TOPIC_CONFIGS)
    assert subtracted["cleanup.policy"] == "compact"


def test_append_to_an_unset_list_starts_from_its_default_as_kafka() -> None:
    appended = apply_config_operations(ops(("cleanup.policy", OP_APPEND, "compact")), {}, ALL_TOPIC_CONFIGS)
    assert appended == {"cleanup.policy": "delete,compact"}
    broker = apply_config_operations(ops(("log.cleanup.policy", OP_APPEND, "compact")), {}, BROKER_CONFIGS)
    assert broker == {"log.cleanup.policy": "delete,compact"}


@pytest.mark.parametrize(("op", "verb"), [(OP_APPEND, "append"), (OP_SUBTRACT, "subtract")])
def test_append_and_subtract_are_only_for_list_configs(op: int, verb: str) -> None:
    with pytest.raises(ConfigRequestError, match=f"Config value {verb} is not allowed for config key: retention.ms"):
        apply_config_operations(ops(("retention.ms", op, "1")), {}, ALL_TOPIC_CONFIGS)


def test_unknown_operation_is_an_invalid_request() -> None:
    with pytest.raises(ConfigRequestError, match="Unknown operations type 9") as refused:
        apply_config_operations(ops(("retention.ms", 9, "1")), {}, ALL_TOPIC_CONFIGS)
    assert refused.value.error_name == "INVALID_REQUEST"
