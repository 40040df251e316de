"""`tierlog user scram set|describe|delete`: users' SCRAM credentials (KIP-554), as `kafka-configs.sh
--entity-type users --alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=...]'` manages them.

The password never leaves this process: librdkafka salts and hashes it (SaltedPassword) and sends only that,
and the cluster keeps only the keys derived from it (docs/security.md#scram-credentials).
"""

from __future__ import annotations

import sys

import click
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    admin_client,
    client_options,
    future_result,
    output_console,
    results_or_errors,
)
from tierlog.cli.tables import plain_table
from tierlog.security.sasl import SCRAM_MECHANISMS

MECHANISMS = {name: ScramMechanism[name.replace("-", "_")] for name in SCRAM_MECHANISMS}
# kafka-configs.sh's iterations when none are given (ConfigCommand.DefaultScramIterations); Kafka accepts
# 4096 to 16384.
DEFAULT_ITERATIONS = 4096

mechanism_option = click.option(
    "--mechanism",
    type=click.Choice(list(MECHANISMS), case_sensitive=False),
    required=True,
    help="The SCRAM mechanism of the credential.",
)


@click.group()
def user() -> None:
    """Manage users' credentials."""


@user.group()
def scram() -> None:
    """Set, describe and delete users' SCRAM credentials (SASL/SCRAM-SHA-256 and SCRAM-SHA-512)."""


@scram.command(name="set")
@click.argument("name", metavar="USER")
@mechanism_option
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=DEFAULT_ITERATIONS,
    show_default=True,
    help="PBKDF2 iterations of the salted password (Kafka accepts 4096 to 16384).",
)
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of standard input instead of prompting for it.",
)
@client_options
def set_(name: str, mechanism: str, iterations: int, password_stdin: bool, client: ClientOptions) -> None:
    """Create or replace USER's credential for one SCRAM mechanism; the password is prompted for (twice)
    unless --password-stdin."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise CliError("the password must not be empty")
    upsertion = UserScramCredentialUpsertion(
        name, ScramCredentialInfo(MECHANISMS[mechanism], iterations), password.encode()
    )
    _alter(upsertion, f"{mechanism} credential of user {name!r}", client)
    click.echo(f"{mechanism} credential of user {name!r} set ({iterations} iterations)")


@scram.command()
@click.argument("name", metavar="USER")
@mechanism_option
@client_options
def delete(name: str, mechanism: str, client: ClientOptions) -> None:
    """Delete USER's credential for one SCRAM mechanism."""
    _alter(UserScramCredentialDeletion(name, MECHANISMS[mechanism]), f"{mechanism} credential of user {name!r}", client)
    click.echo(f"{mechanism} credential of user {name!r} deleted")


def _alter(
    alteration: UserScramCredentialUpsertion | UserScramCredentialDeletion, subject: str, client: ClientOptions
) -> None:
    admin = admin_client(client)
    futures = admin.alter_user_scram_credentials([alteration], request_timeout=client.remaining_s())
    future_result(futures[alteration.user], subject, client)


@scram.command()
@click.argument("names", metavar="[USER]...", nargs=-1)
@client_options
def describe(names: tuple[str, ...], client: ClientOptions) -> None:
    """List the SCRAM mechanisms and iteration counts of the named users, or of every user that has a
    credential; never a password, salt or key."""
    admin = admin_client(client)
    wanted = list(dict.fromkeys(names))
    failures: list[str] = []
    if wanted:
        futures = admin.describe_user_scram_credentials(wanted, request_timeout=client.remaining_s())
        found = results_or_errors(futures, lambda name: f"SCRAM credential of user {name!r}", client)
        descriptions = {name: d for name, d in found.items() if isinstance(d, UserScramCredentialsDescription)}
        failures = [d for d in found.values() if isinstance(d, str)]
    else:
        every = admin.describe_user_scram_credentials(request_timeout=client.remaining_s())
        descriptions = future_result(every, "SCRAM credentials", client)
    table = plain_table("USER", "MECHANISM", "ITERATIONS", right=("ITERATIONS",))
    for name, description in sorted(descriptions.items()):
        for info in sorted(description.scram_credential_infos, key=lambda info: info.mechanism.value):
            table.add_row(name, info.mechanism.name.replace("_", "-"), str(info.iterations))
    if descriptions or not failures:
        output_console().print(table)
    if failures:
        raise CliError("; ".join(failures))
