"""Kafka's `sasl.jaas.config` values: one JAAS login module, its control flag and its options.

    org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret"
        user_admin="admin-secret" user_alice="alice-secret";

The syntax is Kafka's JaasConfig (a Java StreamTokenizer): `<loginModuleClass> <controlFlag> (<name>=<value>)*;`,
values quoted with " or ' (backslash escapes the next character) or bare words, `//` and `/* */` comments.
Rules: docs/security.md#sasl.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
CONTROL_FLAGS = ("required", "requisite", "sufficient", "optional")
_USER_OPTION_PREFIX = "user_"
_WORD_PUNCTUATION = frozenset("._-$")


class JaasConfigError(ValueError):
    """The value is not a JAAS config of one login module; the message is Kafka's where it has one."""


@dataclass(frozen=True, slots=True)
class JaasLoginModule:
    class_name: str
    control_flag: str
    options: dict[str, str]

    @property
    def username(self) -> str | None:
        """The `username` option: the broker's own user when it connects to other brokers."""
        return self.options.get("username")

    @property
    def password(self) -> str | None:
        return self.options.get("password")

    def plain_users(self) -> dict[str, str]:
        """PlainLoginModule's user list: every `user_<name>="<password>"` option."""
        return {
            name[len(_USER_OPTION_PREFIX) :]: password
            for name, password in self.options.items()
            if name.startswith(_USER_OPTION_PREFIX)
        }


def parse_jaas_config(text: str) -> JaasLoginModule:
    """The one login module of a `sasl.jaas.config` value; JaasConfigError if the text is not exactly one."""
    tokens = _tokens(text)
    modules: list[JaasLoginModule] = []
    position = 0
    while position < len(tokens):
        module, position = _login_module(tokens, position)
        modules.append(module)
    if not modules:
        raise JaasConfigError("Login module not specified in JAAS config")
    if len(modules) != 1:
        raise JaasConfigError(f"JAAS config property contains {len(modules)} login modules, should be 1 module")
    return modules[0]


# A token is ("word", text), ("quoted", text) or ("punct", "=" / ";" / any other single character).
_Token = tuple[str, str]


def _login_module(tokens: list[_Token], position: int) -> tuple[JaasLoginModule, int]:
    kind, class_name = tokens[position]
    if kind != "word":
        raise JaasConfigError(f"Login module class expected in JAAS config, found {class_name!r}")
    position += 1
    if position >= len(tokens):
        raise JaasConfigError("Login module control flag not specified in JAAS config")
    kind, flag = tokens[position]
    if kind != "word" or flag.lower() not in CONTROL_FLAGS:
        raise JaasConfigError(f"Invalid login module control flag '{flag}' in JAAS config")
    position += 1
    options: dict[str, str] = {}
    while position < len(tokens) and tokens[position] != ("punct", ";"):
        kind, key = tokens[position]
        has_value = (
            position + 2 < len(tokens)
            and tokens[position + 1] == ("punct", "=")
            and tokens[position + 2][0] in ("word", "quoted")
        )
        if kind == "punct" or not has_value:
            raise JaasConfigError(f"Value not specified for key '{key}' in JAAS config")
        options[key] = tokens[position + 2][1]
        position += 3
    if position >= len(tokens):
        raise JaasConfigError("JAAS config entry not terminated by semi-colon")
    return JaasLoginModule(class_name, flag.lower(), options), position + 1


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif text.startswith("//", i):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise JaasConfigError("Unterminated comment in JAAS config")
            i = end + 2
        elif char in "\"'":
            value, i = _quoted(text, i)
            tokens.append(("quoted", value))
        elif char.isalnum() or char in _WORD_PUNCTUATION:
            start = i
            while i < len(text) and (text[i].isalnum() or text[i] in _WORD_PUNCTUATION):
                i += 1
            tokens.append(("word", text[start:i]))
        else:
            tokens.append(("punct", char))
            i += 1
    return tokens


def _quoted(text: str, start: int) -> tuple[str, int]:
    quote = text[start]
    chars = []
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == quote:
            return "".join(chars), i + 1
        if char == "\\" and i + 1 < len(text):
            i += 1
            char = text[i]
        chars.append(char)
        i += 1
    raise JaasConfigError("Unterminated quoted value in JAAS config")
