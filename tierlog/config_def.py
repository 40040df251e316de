"""Typed, validated configuration entries: Kafka's ConfigDef, shared by broker and topic configs.

A value is read as text (a `server.properties` line, a CreateTopics config, an AlterConfigs value), parsed
as its declared type and checked against its validator. A bad value raises `ConfigException` with Kafka's
own one-line wording, "Invalid value X for configuration NAME: RULE", which names the key, the value and the
rule, so a person knows what to fix and Kafka's admin tools show the same text they would for Kafka.
The rules themselves are in docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# Kafka's ConfigDef.Type names.
TYPES = ("boolean", "string", "int", "short", "long", "double", "list", "class", "password")
_INTEGER_RANGES = {"short": (INT16_MIN, INT16_MAX), "int": (INT32_MIN, INT32_MAX), "long": (LONG_MIN, LONG_MAX)}


class ConfigException(ValueError):
    """A configuration value that cannot be used; the message is one line a person can act on."""


def invalid(name: str, value: object, reason: str) -> ConfigException:
    """Kafka's ConfigException(name, value, message) wording, which its admin tools show verbatim."""
    return ConfigException(f"Invalid value {value} for configuration {name}: {reason}")


# A validator sees the parsed value and returns what is wrong with it, or None when it is fine.
Validator = Callable[[object], str | None]


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One configuration as Kafka defines it: name, type, default, validator and documentation.

    `default` is the typed value (a list's items as a tuple); None means the config has no default (Kafka's
    null), so nothing applies unless it is set. `broker_synonym` is, for a topic config, the broker setting
    that provides its value when the topic does not override it (Kafka's ServerTopicConfigSynonyms).
    """

    name: str
    type: str
    default: object
    doc: str
    at_least: float | None = None
    at_most: float | None = None
    choices: tuple[str, ...] | None = None
    validator: Validator | None = None
    broker_synonym: str | None = None

    def __post_init__(self) -> None:
        assert self.type in TYPES, self.type


def parse_typed(name: str, type_: str, value: str) -> object:
    """`value` as `type_`, with Kafka's message when it is not one (ConfigDef.parseType)."""
    text = value.strip()
    if type_ in _INTEGER_RANGES:
        low, high = _INTEGER_RANGES[type_]
        try:
            number = int(text)
        except ValueError:
            raise invalid(name, value, f"Not a number of type {type_.upper()}") from None
        if not low <= number <= high:
            raise invalid(name, value, f"Not a number of type {type_.upper()}")
        return number
    if type_ == "double":
        try:
            return float(text)
        except ValueError:
            raise invalid(name, value, "Not a number of type DOUBLE") from None
    if type_ == "boolean":
        if text.lower() not in ("true", "false"):
            raise invalid(name, value, "Expected value to be either true or false")
        return text.lower() == "true"
    if type_ == "list":
        return tuple(item.strip() for item in text.split(",") if item.strip())
    return text


def parse_config_value(definition: ConfigDef, value: str) -> object:
    """Parse and validate `value` for `definition`; ConfigException with Kafka's one-line message if invalid."""
    parsed = parse_typed(definition.name, definition.type, value)
    if definition.choices is not None:
        for item in parsed if isinstance(parsed, tuple) else (parsed,):
            if item not in definition.choices:
                raise invalid(definition.name, str(item), f"String must be one of: {', '.join(definition.choices)}")
    if definition.at_least is not None and parsed < definition.at_least:  # type: ignore[operator]
        raise invalid(definition.name, value, f"Value must be at least {_number(definition.at_least)}")
    if definition.at_most is not None and parsed > definition.at_most:  # type: ignore[operator]
        raise invalid(definition.name, value, f"Value must be no more than {_number(definition.at_most)}")
    if definition.validator is not None:
        problem = definition.validator(parsed)
        if problem is not None:
            raise invalid(definition.name, value, problem)
    return parsed


def render(value: object) -> str:
    """A typed value as Kafka shows it in DescribeConfigs: booleans lower case, lists comma-separated, null ''."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _number(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)
