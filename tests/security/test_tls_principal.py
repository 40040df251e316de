"""The principal of a TLS client certificate: its subject rendered as Kafka's X500Principal.getName() (RFC
2253) and mapped by ssl.principal.mapping.rules, with the examples of Kafka's SslPrincipalMapperTest."""

from __future__ import annotations

import asyncio

import pytest
from tls_helpers import TlsFiles, make_tls_files

from tierlog.client.requests import api_versions_request
from tierlog.client.wire import encode_request
from tierlog.security.principal import ANONYMOUS, KafkaPrincipal
from tierlog.security.ssl_context import (
    NoMatchingRuleError,
    SslPrincipalMapper,
    SslSettings,
    client_context,
    mapping_rules_problem,
    server_context,
    subject_name,
)
from tierlog.server.connection import serve_connection
from tierlog.server.kafka_apis import API_API_VERSIONS
from tierlog.server.request_context import principal

KAFKA_RULES = ",".join(
    [
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]
)


@pytest.mark.parametrize(
    ("name", "mapped"),
    [
        ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
        ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
        ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
        ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
        ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
    ],
)
def test_kafkas_mapping_examples(name: str, mapped: str) -> None:
    assert SslPrincipalMapper(KAFKA_RULES).name_of(name) == mapped


def test_an_escaped_comma_in_a_name_is_kept() -> None:
    mapper = SslPrincipalMapper(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name_of(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


def test_a_back_reference_to_a_missing_group_stays_literal() -> None:
    assert SslPrincipalMapper("RULE:^CN=(.*?),.*$/$1-$2/").name_of("CN=alice,O=acme") == "alice-$2"


def test_the_default_rule_keeps_the_whole_name() -> None:
    assert SslPrincipalMapper("DEFAULT").name_of("CN=alice,OU=eng,O=acme") == "CN=alice,OU=eng,O=acme"


def test_a_name_no_rule_matches_is_an_error() -> None:
    with pytest.raises(NoMatchingRuleError):
        SslPrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/").name_of("CN=alice,OU=eng")


@pytest.mark.parametrize(
    "rules",
    [
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
        ",,RULE://,,,DEFAULT,,",
    ],
)
def test_kafkas_valid_rules_parse(rules: str) -> None:
    assert mapping_rules_problem(rules) is None


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
    ],
)
def test_kafkas_invalid_rules_are_refused(rules: str) -> None:
    assert mapping_rules_problem(rules) is not None


def test_subject_is_rendered_as_rfc_2253_most_specific_first() -> None:
    peercert = {
        "subject": (
            (("countryName", "US"),),
            (("organizationName", "acme, inc"),),
            (("organizationalUnitName", "eng"), ("userId", "42")),
            (("commonName", "alice"),),
            (("emailAddress", "a@x.io"),),
        )
    }
    # Java renders attributes without an RFC 2253 keyword as OID=#<DER>: an IA5String for an e-mail address.
    email = "1.2.840.113549.1.9.1=#1606" + b"a@x.io".hex()
    assert subject_name(peercert) == email + r",CN=alice,OU=eng+UID=42,O=acme\, inc,C=US"


def test_a_client_certificates_subject_becomes_the_principal(tmp_path_factory: pytest.TempPathFactory) -> None:
    files: TlsFiles = make_tls_files(tmp_path_factory.mktemp("tls"))
    server = server_context(
        SslSettings(
            keystore_type="PEM",
            keystore_location=str(files.keystore_path),
            truststore_type="PEM",
            truststore_location=str(files.ca_path),
            client_auth="required",
        )
    )
    client = client_context(SslSettings(truststore_type="PEM", truststore_location=str(files.ca_path)))
    client.load_cert_chain(files.client_cert_path, files.client_key_path)

    async def handshake() -> dict[str, object]:
        seen: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("peercert"))
            writer.close()

        listener = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=server)
        port = listener.sockets[0].getsockname()[1]
        async with listener, asyncio.timeout(10):
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="127.0.0.1")
            certificate = await seen
            writer.close()
        return certificate

    certificate = asyncio.run(handshake())
    assert subject_name(certificate) == "CN=alice,OU=eng,O=acme"
    mapper = SslPrincipalMapper("RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$3/L,DEFAULT")
    assert mapper.principal_of(certificate) == KafkaPrincipal("User", "alice@acme")


class _RecordingApis:
    """Just enough of KafkaApis for serve_connection: ApiVersions is served, and each request's principal kept."""

    def __init__(self) -> None:
        self.handlers = {API_API_VERSIONS: None}
        self.principals: asyncio.Queue[KafkaPrincipal] = asyncio.Queue()

    async def handle(self, request: object) -> None:
        await self.principals.put(principal())


@pytest.mark.parametrize("with_certificate", [True, False])
def test_serve_connection_makes_a_certificate_the_principal_and_no_certificate_anonymous(
    tmp_path_factory: pytest.TempPathFactory, with_certificate: bool
) -> None:
    files = make_tls_files(tmp_path_factory.mktemp("tls"))
    server = server_context(
        SslSettings(
            keystore_type="PEM",
            keystore_location=str(files.keystore_path),
            truststore_type="PEM",
            truststore_location=str(files.ca_path),
            client_auth="requested",
        )
    )
    client = client_context(SslSettings(truststore_type="PEM", truststore_location=str(files.ca_path)))
    if with_certificate:
        client.load_cert_chain(files.client_cert_path, files.client_key_path)
    mapper = SslPrincipalMapper("RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$3/L")

    async def first_principal() -> KafkaPrincipal:
        apis = _RecordingApis()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await serve_connection(
                reader,
                writer,
                apis,
                1 << 20,
                "SSL",
                security_protocol="SSL",
                ssl_principal_mapper=mapper,  # type: ignore[arg-type]
            )

        listener = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=server)
        port = listener.sockets[0].getsockname()[1]
        async with listener, asyncio.timeout(10):
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="127.0.0.1")
            writer.write(encode_request(api_versions_request(), 0, "test"))
            seen = await apis.principals.get()
            writer.close()
        return seen

    expected = KafkaPrincipal("User", "alice@acme") if with_certificate else ANONYMOUS
    assert asyncio.run(first_principal()) == expected
