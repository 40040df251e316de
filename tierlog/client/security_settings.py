"""Client security settings as people write them, turned into what each client of the project takes.

Two spellings reach the project: the Java client's (Spark's `kafka.*` options, a client.properties made for
Kafka's tools: `sasl.jaas.config`, `ssl.truststore.location`, ...) and librdkafka's (`-X`, `--command-config`,
`kcat -F`: `sasl.username`, `ssl.ca.location`, ...). `to_librdkafka` maps the first onto the second, which the
confluent-kafka clients take as they are; `client_security` makes the `ClientSecurity` of tierlog's own
connections (KafkaConnection, the probes) from librdkafka's. Every refusal is one line naming the setting.
Rules: docs/security.md#tools.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping

from tierlog.client.security import SECURITY_PROTOCOLS, ClientSecurity
from tierlog.security import jaas
from tierlog.security.sasl import SUPPORTED_MECHANISMS
from tierlog.security.ssl_context import load_inline_cert_chain

__all__ = ["SECURITY_PROTOCOLS", "SecuritySettingError", "client_security", "to_librdkafka"]

# Store types Java reads and librdkafka cannot: their file names, for a store given without its type.
_BINARY_STORE_SUFFIXES = {".jks": "JKS", ".p12": "PKCS12", ".pfx": "PKCS12"}

Describe = Callable[[str], str]


class SecuritySettingError(ValueError):
    """A security setting that cannot be used; the message is one line naming it."""


def _setting(key: str) -> str:
    return f"setting '{key}'"


def to_librdkafka(settings: Mapping[str, str], describe: Describe = _setting) -> tuple[dict[str, str], dict[str, str]]:
    """`settings` with the Java client's security names replaced by librdkafka's, and, for every resulting key,
    the key it came from (so a later error names what the person wrote). Other settings pass unchanged.

    Java's key and trust stores are files librdkafka reads only as PEM: a JKS or PKCS12 store is refused, with
    how to convert it."""
    out: dict[str, str] = {}
    origin: dict[str, str] = {}

    def put(key: str, value: str, source: str) -> None:
        if key in out and out[key] != value:
            raise SecuritySettingError(f"{describe(source)}: conflicts with {describe(origin[key])}")
        out[key] = value
        origin[key] = source

    java_only = {
        "sasl.jaas.config",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
        "ssl.keystore.location",
        "ssl.keystore.type",
        "ssl.keystore.password",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.endpoint.identification.algorithm",
    }
    for key, value in settings.items():
        if key not in java_only:
            put(key, value, key)
    if "sasl.jaas.config" in settings:
        username, password = parse_jaas_config(settings["sasl.jaas.config"], describe)
        put("sasl.username", username, "sasl.jaas.config")
        put("sasl.password", password, "sasl.jaas.config")
    truststore = settings.get("ssl.truststore.location")
    if truststore is not None:
        _require_pem(settings, "truststore", describe)
        if settings.get("ssl.truststore.password"):
            # Kafka's rule too: a PEM trust store holds certificates only, there is nothing to unlock.
            raise SecuritySettingError(
                f"{describe('ssl.truststore.password')}: a PEM trust store takes no password (remove it)"
            )
        put("ssl.ca.location", truststore, "ssl.truststore.location")
    if "ssl.truststore.certificates" in settings:
        put("ssl.ca.pem", settings["ssl.truststore.certificates"], "ssl.truststore.certificates")
    keystore = settings.get("ssl.keystore.location")
    if keystore is not None:
        _require_pem(settings, "keystore", describe)
        if settings.get("ssl.keystore.password"):
            raise SecuritySettingError(
                f"{describe('ssl.keystore.password')}: a PEM key store takes no store password; "
                "give the private key's password as ssl.key.password"
            )
        # One PEM file holding the private key and the certificate chain: each reader takes its part of it.
        put("ssl.certificate.location", keystore, "ssl.keystore.location")
        put("ssl.key.location", keystore, "ssl.keystore.location")
    if "ssl.keystore.certificate.chain" in settings:
        put("ssl.certificate.pem", settings["ssl.keystore.certificate.chain"], "ssl.keystore.certificate.chain")
    if "ssl.keystore.key" in settings:
        put("ssl.key.pem", settings["ssl.keystore.key"], "ssl.keystore.key")
    if "ssl.keystore.type" in settings and keystore is None:
        _require_pem(settings, "keystore", describe)
    if "ssl.truststore.type" in settings and truststore is None:
        _require_pem(settings, "truststore", describe)
    algorithm = settings.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        # Java's "" (no host name check) is librdkafka's "none".
        put("ssl.endpoint.identification.algorithm", algorithm or "none", "ssl.endpoint.identification.algorithm")
    return out, origin


def _require_pem(settings: Mapping[str, str], store: str, describe: Describe) -> None:
    type_key, location_key = f"ssl.{store}.type", f"ssl.{store}.location"
    given = settings.get(type_key)
    if given is not None:
        store_type, key = given.strip().upper(), type_key
    else:
        location = settings.get(location_key, "")
        store_type, key = _BINARY_STORE_SUFFIXES.get(os.path.splitext(location)[1].lower(), "PEM"), location_key
    if store_type != "PEM":
        raise SecuritySettingError(
            f"{describe(key)}: only PEM {store}s are supported, not {store_type}; convert it "
            f"(keytool -exportcert -rfc, or openssl pkcs12 -nodes) and set {type_key}=PEM"
        )


def parse_jaas_config(text: str, describe: Describe = _setting) -> tuple[str, str]:
    """(username, password) of a JAAS entry of Kafka's PlainLoginModule or ScramLoginModule, as in
    `org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="secret";`,
    read as the broker reads its own (security/jaas.py, Kafka's JaasConfig syntax)."""
    problem = f"{describe('sasl.jaas.config')}: "
    try:
        module = jaas.parse_jaas_config(text)
    except jaas.JaasConfigError as e:
        raise SecuritySettingError(problem + str(e)) from None
    if module.class_name not in (jaas.PLAIN_LOGIN_MODULE, jaas.SCRAM_LOGIN_MODULE):
        raise SecuritySettingError(
            problem + f"login module {module.class_name} is not supported (use PlainLoginModule or ScramLoginModule)"
        )
    if module.username is None or module.password is None:
        missing = [name for name in ("username", "password") if name not in module.options]
        raise SecuritySettingError(problem + f"has no {' and no '.join(missing)}")
    return module.username, module.password


def client_security(settings: Mapping[str, str], describe: Describe = _setting) -> ClientSecurity:
    """The ClientSecurity of librdkafka-style `settings` (security.protocol, sasl.mechanism, sasl.username,
    sasl.password, ssl.ca.location or ssl.ca.pem, ssl.certificate.location + ssl.key.location or their .pem
    forms, ssl.key.password, ssl.endpoint.identification.algorithm, enable.ssl.certificate.verification),
    with librdkafka's defaults: host names are checked, and without a CA the system's trust store is used."""
    protocol = settings.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise SecuritySettingError(
            f"{describe('security.protocol')}: must be one of {', '.join(SECURITY_PROTOCOLS)}, not {protocol!r}"
        )
    security = ClientSecurity(protocol=protocol)
    if security.uses_tls:
        security = ClientSecurity(protocol=protocol, ssl_context=_ssl_context(settings, describe))
    if not security.uses_sasl:
        return security
    key = "sasl.mechanism" if "sasl.mechanism" in settings else "sasl.mechanisms"
    mechanism = settings.get(key, "").strip().upper()
    if mechanism not in SUPPORTED_MECHANISMS:
        raise SecuritySettingError(
            f"{describe(key)}: security.protocol={protocol} needs sasl.mechanism, "
            f"one of {', '.join(SUPPORTED_MECHANISMS)}" + (f", not {mechanism!r}" if mechanism else "")
        )
    for credential in ("sasl.username", "sasl.password"):
        if not settings.get(credential):
            raise SecuritySettingError(f"security.protocol={protocol} with {mechanism} needs {credential}")
    return ClientSecurity(
        protocol=protocol,
        ssl_context=security.ssl_context,
        sasl_mechanism=mechanism,
        sasl_username=settings["sasl.username"],
        sasl_password=settings["sasl.password"],
    )


def _ssl_context(settings: Mapping[str, str], describe: Describe) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if "ssl.ca.location" in settings:
            context.load_verify_locations(cafile=settings["ssl.ca.location"])
        elif "ssl.ca.pem" in settings:
            context.load_verify_locations(cadata=settings["ssl.ca.pem"])
    except (OSError, ssl.SSLError, ValueError) as e:
        key = "ssl.ca.location" if "ssl.ca.location" in settings else "ssl.ca.pem"
        raise SecuritySettingError(f"{describe(key)}: not a readable PEM certificate file ({_reason(e)})") from None
    verify = settings.get("enable.ssl.certificate.verification", "true").strip().lower()
    if verify not in ("true", "false"):
        raise SecuritySettingError(f"{describe('enable.ssl.certificate.verification')}: must be true or false")
    algorithm = settings.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", "none"):
        raise SecuritySettingError(f"{describe('ssl.endpoint.identification.algorithm')}: must be https or none")
    context.check_hostname = verify == "true" and algorithm == "https"
    if verify == "false":
        context.verify_mode = ssl.CERT_NONE
    _load_client_certificate(context, settings, describe)
    return context


def _load_client_certificate(context: ssl.SSLContext, settings: Mapping[str, str], describe: Describe) -> None:
    """The client's own certificate and key, for a listener with ssl.client.auth: from files, or inline PEM."""
    password = settings.get("ssl.key.password") or None
    if "ssl.certificate.location" in settings or "ssl.key.location" in settings:
        certificate_key, key_key = "ssl.certificate.location", "ssl.key.location"
        if certificate_key not in settings or key_key not in settings:
            given = certificate_key if certificate_key in settings else key_key
            raise SecuritySettingError(f"{describe(given)}: needs both ssl.certificate.location and ssl.key.location")
        try:
            context.load_cert_chain(settings[certificate_key], settings[key_key], password)
        except (OSError, ssl.SSLError) as e:
            raise SecuritySettingError(
                f"{describe(certificate_key)}: cannot load the certificate and key ({_reason(e)})"
            ) from None
    elif "ssl.certificate.pem" in settings or "ssl.key.pem" in settings:
        if "ssl.certificate.pem" not in settings or "ssl.key.pem" not in settings:
            given = "ssl.certificate.pem" if "ssl.certificate.pem" in settings else "ssl.key.pem"
            raise SecuritySettingError(f"{describe(given)}: needs both ssl.certificate.pem and ssl.key.pem")
        try:
            load_inline_cert_chain(context, settings["ssl.certificate.pem"] + "\n" + settings["ssl.key.pem"], password)
        except ssl.SSLError as e:
            raise SecuritySettingError(
                f"{describe('ssl.certificate.pem')}: cannot load the certificate and key ({_reason(e)})"
            ) from None


def _reason(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    return str(error).strip() or type(error).__name__
