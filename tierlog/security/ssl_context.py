"""TLS with Python's `ssl`: the SSLContext of a listener (server side) and of the project's own connections
(client side) from Kafka's ssl.* settings, and the principal of a client certificate (Kafka's
SslPrincipalMapper over the subject as X500Principal.getName() renders it). Built from plain values, so that
security does not depend on config; the broker's KafkaConfig gathers the values. Rules: docs/security.md#tls.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from tierlog.security.principal import USER_TYPE, KafkaPrincipal

PEM = "PEM"
CLIENT_AUTH_MODES = ("required", "requested", "none")
_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_SSL_PROTOCOLS = ("TLS", "TLSv1.2", "TLSv1.3")
_TLS13_SUITES = frozenset(c["name"] for c in ssl.create_default_context().get_ciphers() if c["protocol"] == "TLSv1.3")


class SslConfigError(Exception):
    """An ssl.* setting cannot be used; the message is one line naming the key (and the file)."""


@dataclass(frozen=True, slots=True)
class SslSettings:
    """Kafka's ssl.* settings of one listener (or of the broker's own connections), as plain values."""

    keystore_type: str = "JKS"
    keystore_location: str | None = None
    key_password: str | None = None
    keystore_certificate_chain: str | None = None
    keystore_key: str | None = None
    truststore_type: str = "JKS"
    truststore_location: str | None = None
    truststore_certificates: str | None = None
    client_auth: str = "none"
    enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")
    protocol: str = "TLSv1.3"
    cipher_suites: tuple[str, ...] = ()
    endpoint_identification_algorithm: str = "https"
    principal_mapping_rules: str = "DEFAULT"

    @property
    def has_keystore(self) -> bool:
        return bool(self.keystore_location or self.keystore_certificate_chain)

    @property
    def has_truststore(self) -> bool:
        return bool(self.truststore_location or self.truststore_certificates)


def settings_problem(settings: SslSettings) -> str | None:
    """What is wrong with the settings without reading any file (start-up checks them before any I/O)."""
    if settings.has_keystore and settings.keystore_type.upper() != PEM:
        return (
            f"ssl.keystore.type={settings.keystore_type}: tierlog reads PEM key stores only "
            "(a PEM file with the private key and certificate chain); set ssl.keystore.type=PEM"
        )
    if settings.keystore_location and settings.keystore_certificate_chain:
        return "ssl.keystore.location and ssl.keystore.certificate.chain are both set: give one key store"
    if bool(settings.keystore_certificate_chain) != bool(settings.keystore_key):
        return "ssl.keystore.certificate.chain and ssl.keystore.key go together: set both or neither"
    if settings.has_truststore and settings.truststore_type.upper() != PEM:
        return (
            f"ssl.truststore.type={settings.truststore_type}: tierlog reads PEM trust stores only; "
            "set ssl.truststore.type=PEM"
        )
    if settings.truststore_location and settings.truststore_certificates:
        return "ssl.truststore.location and ssl.truststore.certificates are both set: give one trust store"
    unknown = [p for p in settings.enabled_protocols if p not in _TLS_VERSIONS]
    if unknown or not settings.enabled_protocols:
        return (
            f"ssl.enabled.protocols={','.join(settings.enabled_protocols)}: tierlog supports {', '.join(_TLS_VERSIONS)}"
        )
    if settings.protocol not in _SSL_PROTOCOLS:
        return f"ssl.protocol={settings.protocol}: tierlog supports {', '.join(_SSL_PROTOCOLS)}"
    if settings.protocol == "TLSv1.2" and "TLSv1.2" not in settings.enabled_protocols:
        return "ssl.protocol=TLSv1.2 but ssl.enabled.protocols does not enable TLSv1.2"
    tls13 = sorted(set(settings.cipher_suites) & _TLS13_SUITES)
    if tls13:
        return (
            f"ssl.cipher.suites names TLS 1.3 suites ({', '.join(tls13)}), which Python's ssl cannot restrict: "
            "list TLS 1.2 suites only (OpenSSL names, e.g. ECDHE-RSA-AES128-GCM-SHA256) or leave it empty"
        )
    if settings.client_auth not in CLIENT_AUTH_MODES:
        return f"ssl.client.auth={settings.client_auth}: give one of {', '.join(CLIENT_AUTH_MODES)}"
    if settings.endpoint_identification_algorithm.lower() not in ("https", ""):
        return (
            f"ssl.endpoint.identification.algorithm={settings.endpoint_identification_algorithm}: "
            "give https, or nothing to turn host name checks off"
        )
    return None


def server_context(settings: SslSettings) -> ssl.SSLContext:
    """The SSLContext of a TLS listener: its key store, and for ssl.client.auth=required|requested the trust
    store that client certificates must chain to. SslConfigError when a setting or a file cannot be used."""
    if not settings.has_keystore:
        raise SslConfigError(
            "no key store: set ssl.keystore.location, or ssl.keystore.certificate.chain and ssl.keystore.key"
        )
    context = _context(settings, ssl.PROTOCOL_TLS_SERVER)
    context.verify_mode = {
        "required": ssl.CERT_REQUIRED,
        "requested": ssl.CERT_OPTIONAL,
        "none": ssl.CERT_NONE,
    }[settings.client_auth]
    if context.verify_mode != ssl.CERT_NONE:
        _load_truststore(context, settings, ssl.Purpose.CLIENT_AUTH)
    return context


def client_context(settings: SslSettings) -> ssl.SSLContext:
    """The SSLContext of a connection to a TLS listener: the trust store (the system's when none is set), the
    key store as client certificate when one is set, host name checks unless the algorithm is empty."""
    context = _context(settings, ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = settings.endpoint_identification_algorithm.lower() == "https"
    _load_truststore(context, settings, ssl.Purpose.SERVER_AUTH)
    return context


def _context(settings: SslSettings, protocol: ssl._SSLMethod) -> ssl.SSLContext:
    problem = settings_problem(settings)
    if problem is not None:
        raise SslConfigError(problem)
    context = ssl.SSLContext(protocol)
    versions = sorted(_TLS_VERSIONS[p] for p in settings.enabled_protocols)
    context.minimum_version = versions[0]
    context.maximum_version = ssl.TLSVersion.TLSv1_2 if settings.protocol == "TLSv1.2" else versions[-1]
    if settings.cipher_suites:
        try:
            context.set_ciphers(":".join(settings.cipher_suites))
        except ssl.SSLError:
            raise SslConfigError(
                f"ssl.cipher.suites={','.join(settings.cipher_suites)}: OpenSSL knows none of these suites "
                "(give OpenSSL names, e.g. ECDHE-RSA-AES128-GCM-SHA256)"
            ) from None
    if settings.has_keystore:
        _load_keystore(context, settings)
    return context


def _load_keystore(context: ssl.SSLContext, settings: SslSettings) -> None:
    if settings.keystore_location:
        _load(
            "ssl.keystore.location",
            settings.keystore_location,
            "a PEM private key and certificate chain (with ssl.key.password if the key is encrypted)",
            lambda: context.load_cert_chain(settings.keystore_location or "", password=settings.key_password),
        )
        return
    _load(
        "ssl.keystore.certificate.chain/ssl.keystore.key",
        "(inline)",
        "a PEM certificate chain and private key (with ssl.key.password if the key is encrypted)",
        lambda: load_inline_cert_chain(
            context, f"{settings.keystore_key}\n{settings.keystore_certificate_chain}\n", settings.key_password
        ),
    )


def load_inline_cert_chain(context: ssl.SSLContext, pem: str, password: str | None) -> None:
    """`context.load_cert_chain` of a private key and certificate chain given as PEM text rather than a file.
    Python's ssl loads them only from a file: the text goes through a private temporary one, gone once loaded."""
    with tempfile.TemporaryDirectory(prefix="tierlog-keystore-") as directory:
        path = os.path.join(directory, "keystore.pem")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
            file.write(pem)
        context.load_cert_chain(path, password=password)


def _load_truststore(context: ssl.SSLContext, settings: SslSettings, purpose: ssl.Purpose) -> None:
    if settings.truststore_location:
        location = settings.truststore_location
        _load(
            "ssl.truststore.location",
            location,
            "PEM certificates",
            lambda: context.load_verify_locations(cafile=location),
        )
    elif settings.truststore_certificates:
        certificates = settings.truststore_certificates
        _load(
            "ssl.truststore.certificates",
            "(inline)",
            "PEM certificates",
            lambda: context.load_verify_locations(cadata=certificates),
        )
    else:
        context.load_default_certs(purpose)


def _load(key: str, where: str, what: str, load: Callable[[], None]) -> None:
    try:
        load()
    except OSError as e:
        if isinstance(e, ssl.SSLError):
            reason = e.reason or str(e)
            raise SslConfigError(f"{key}={where}: not {what} ({reason})") from None
        raise SslConfigError(f"{key}={where}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:  # load_verify_locations(cadata=...) without a certificate in it
        raise SslConfigError(f"{key}={where}: not {what} ({e})") from None


# The subject of a certificate as Java's X500Principal.getName() renders it (RFC 2253): the RDNs from the
# most specific (CN) to the least, "+" between the values of a multi-valued RDN. Python's ssl names the
# attributes with OpenSSL's long names; RFC 2253's keywords are used for those it has, the rest go out as
# OID=#hex of the DER string as Java does (IA5String for e-mail addresses, UTF8String for the others).
_RFC2253_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_OIDS = {
    "emailAddress": ("1.2.840.113549.1.9.1", 0x16),
    "serialNumber": ("2.5.4.5", 0x13),
    "surname": ("2.5.4.4", 0x0C),
    "givenName": ("2.5.4.42", 0x0C),
    "title": ("2.5.4.12", 0x0C),
    "initials": ("2.5.4.43", 0x0C),
    "generationQualifier": ("2.5.4.44", 0x0C),
    "dnQualifier": ("2.5.4.46", 0x13),
    "pseudonym": ("2.5.4.65", 0x0C),
    "businessCategory": ("2.5.4.15", 0x0C),
    "postalCode": ("2.5.4.17", 0x0C),
}


def subject_name(peercert: dict[str, object]) -> str:
    """The subject of a peer certificate (ssl's getpeercert() dict) as X500Principal.getName()."""
    rdns = peercert.get("subject", ())
    assert isinstance(rdns, tuple)
    return ",".join("+".join(_attribute(name, value) for name, value in rdn) for rdn in reversed(rdns))


def _attribute(name: str, value: str) -> str:
    keyword = _RFC2253_KEYWORDS.get(name)
    if keyword is not None:
        return f"{keyword}={_escape(value)}"
    oid, tag = _OIDS.get(name, (name, 0x0C))
    return f"{oid}=#{_der_string(tag, value.encode()).hex()}"


def _escape(value: str) -> str:
    escaped = re.sub(r'([,+"\\<>;])', r"\\\1", value)
    if escaped.startswith(("#", " ")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and len(escaped) > 1 and not escaped.endswith("\\ "):
        escaped = escaped[:-1] + "\\ "
    return escaped


def _der_string(tag: int, data: bytes) -> bytes:
    if len(data) < 0x80:
        return bytes((tag, len(data))) + data
    length = len(data).to_bytes((len(data).bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(length))) + length + data


# Kafka's SslPrincipalMapper: ssl.principal.mapping.rules is a comma-separated list of DEFAULT (the whole
# name) and RULE:pattern/replacement/[LU] (a Java regex that must match the whole name, a replacement with $n
# back references, then lower or upper case); the first rule that matches gives the name.
_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE_PATTERN)


class NoMatchingRuleError(Exception):
    """No rule of ssl.principal.mapping.rules applies to a name (Kafka's NoMatchingRule)."""


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        groups = self.pattern.groups
        result = self.pattern.sub(lambda m: _java_replacement(self.replacement, m, groups), name)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


def _java_replacement(replacement: str, match: re.Match[str], groups: int) -> str:
    """Java's Matcher.replaceAll replacement: backslash quotes the next character, $n is group n, taking as many
    digits as name an existing group; a reference to a group that does not exist stays literal (Kafka's
    escapeLiteralBackReferences)."""
    out = []
    i = 0
    while i < len(replacement):
        char = replacement[i]
        if char == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
            continue
        if char == "$" and i + 1 < len(replacement) and replacement[i + 1].isdigit():
            number = int(replacement[i + 1])
            if number > groups:
                out.append(replacement[i : i + 2])
                i += 2
                continue
            j = i + 2
            while j < len(replacement) and replacement[j].isdigit() and number * 10 + int(replacement[j]) <= groups:
                number = number * 10 + int(replacement[j])
                j += 1
            out.append(match.group(number) or "")
            i = j
            continue
        out.append(char)
        i += 1
    return "".join(out)


class SslPrincipalMapper:
    def __init__(self, rules: str) -> None:
        parsed = (_parse_rule(rule) for rule in _split_rules(rules))
        self._rules = [rule for rule in parsed if rule is not None]

    def name_of(self, distinguished_name: str) -> str:
        for rule in self._rules:
            name = rule.apply(distinguished_name)
            if name is not None:
                return name
        raise NoMatchingRuleError(f"No rules apply to {distinguished_name}")

    def principal_of(self, peercert: dict[str, object]) -> KafkaPrincipal:
        """The principal of a verified client certificate: User:<mapped subject>."""
        return KafkaPrincipal(USER_TYPE, self.name_of(subject_name(peercert)))


def _split_rules(rules: str) -> list[str]:
    return [match.group(1) for match in _RULE_SPLITTER.finditer(rules.strip())]


def _parse_rule(rule: str) -> _Rule | None:
    match = _RULE_PARSER.match(rule)
    assert match is not None  # the last alternative matches anything
    if match.end() != len(rule):
        raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[match.end() :]}`")
    if match.group(1) is not None:
        return _Rule(None)
    if match.group(2) is not None:
        try:
            pattern = re.compile(match.group(2))
        except re.error as e:
            raise ValueError(f"Invalid rule: {rule} ({e})") from None
        return _Rule(pattern, match.group(4), match.group(6))
    return None  # an empty rule is ignored


def mapping_rules_problem(rules: str) -> str | None:
    """Kafka refuses ssl.principal.mapping.rules that do not parse when the config is read."""
    try:
        SslPrincipalMapper(rules)
    except ValueError as e:
        return str(e)
    return None
