"""`tierlog acl create|list|delete`: the ACLs of a cluster with StandardAuthorizer, as `kafka-acls.sh` manages them
(its option names: --allow-principal, --deny-principal, --operation, --topic, --group, --cluster,
--transactional-id, --resource-pattern-type). Rules: docs/security.md#authorizer.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import click
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)
from rich.text import Text

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
from tierlog.security.acl import CLUSTER_NAME
from tierlog.security.authorizer import STANDARD_AUTHORIZER
from tierlog.security.principal import KafkaPrincipal

_ANY = "*"

# kafka-acls.sh's spellings (Read, DescribeConfigs, ...), matched without case or underscores.
_OPERATIONS = {op.name.replace("_", "").lower(): op for op in AclOperation if op.value > 1}
_OPERATION_NAMES = ", ".join(
    sorted("".join(word.capitalize() for word in op.name.split("_")) for op in AclOperation if op.value > 1)
)
_PATTERN_TYPES = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
_FILTER_PATTERN_TYPES = {
    **_PATTERN_TYPES,
    "any": ResourcePatternType.ANY,
    "match": ResourcePatternType.MATCH,
}
# Kafka calls it CLUSTER; librdkafka's name for the same code (4) is BROKER.
_RESOURCE_NAMES = {ResourceType.BROKER: "CLUSTER"}


def _operation(_ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[AclOperation]:
    operations = []
    for value in values:
        operation = _OPERATIONS.get(value.replace("_", "").replace("-", "").lower())
        if operation is None:
            raise click.BadParameter(f"{value!r} is not an operation (one of {_OPERATION_NAMES})", param=param)
        operations.append(operation)
    return operations


def _principals(_ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        try:
            KafkaPrincipal.parse(value)
        except ValueError:
            raise click.BadParameter(
                f"{value!r} is not a principal of the form Type:name (e.g. User:alice)", param=param
            ) from None
    return values


def _resource_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        (
            click.option("--topic", "topics", multiple=True, metavar="NAME", help="A topic (repeatable)."),
            click.option("--group", "groups", multiple=True, metavar="NAME", help="A consumer group (repeatable)."),
            click.option(
                "--transactional-id",
                "transactional_ids",
                multiple=True,
                metavar="ID",
                help="A transactional id (repeatable).",
            ),
            click.option("--cluster", is_flag=True, help=f"The cluster ({CLUSTER_NAME})."),
        )
    ):
        command = option(command)
    return command


def _resources(
    topics: Iterable[str], groups: Iterable[str], transactional_ids: Iterable[str], cluster: bool
) -> list[tuple[ResourceType, str]]:
    resources = [(ResourceType.TOPIC, name) for name in topics]
    resources += [(ResourceType.GROUP, name) for name in groups]
    resources += [(ResourceType.TRANSACTIONAL_ID, name) for name in transactional_ids]
    if cluster:
        resources.append((ResourceType.BROKER, CLUSTER_NAME))
    return resources


@click.group()
def acl() -> None:
    """Create, list and delete ACLs (brokers with authorizer.class.name set)."""


@acl.command()
@click.option(
    "--allow-principal",
    "allow",
    multiple=True,
    callback=_principals,
    metavar="TYPE:NAME",
    help="Allow it (User:alice).",
)
@click.option(
    "--deny-principal", "deny", multiple=True, callback=_principals, metavar="TYPE:NAME", help="Deny it (User:bob)."
)
@click.option(
    "--host", "hosts", multiple=True, metavar="ADDRESS", help="Client address the ACL is for (default: every host, *)."
)
@click.option(
    "--operation",
    "operations",
    multiple=True,
    required=True,
    callback=_operation,
    metavar="OPERATION",
    help=f"Read, Write, Describe, All, ... (repeatable; one of {_OPERATION_NAMES}).",
)
@_resource_options
@click.option(
    "--resource-pattern-type",
    "pattern_type",
    type=click.Choice(sorted(_PATTERN_TYPES), case_sensitive=False),
    default="literal",
    show_default=True,
    help="literal: the resource names exactly (or * for all); prefixed: every name starting with them.",
)
@client_options
def create(
    allow: tuple[str, ...],
    deny: tuple[str, ...],
    hosts: tuple[str, ...],
    operations: list[AclOperation],
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    transactional_ids: tuple[str, ...],
    cluster: bool,
    pattern_type: str,
    client: ClientOptions,
) -> None:
    """Create an ACL for each principal, host, operation and resource given.

    tierlog acl create --allow-principal User:alice --operation Read --topic orders"""
    if not allow and not deny:
        raise CliError("give --allow-principal or --deny-principal (e.g. --allow-principal User:alice)")
    resources = _resources(topics, groups, transactional_ids, cluster)
    if not resources:
        raise CliError("give a resource: --topic, --group, --transactional-id or --cluster")
    entries = [(p, AclPermissionType.ALLOW) for p in allow] + [(p, AclPermissionType.DENY) for p in deny]
    bindings = [
        AclBinding(resource_type, name, _PATTERN_TYPES[pattern_type.lower()], principal, host, operation, permission)
        for (resource_type, name), (principal, permission), host, operation in itertools.product(
            resources, entries, hosts or (_ANY,), operations
        )
    ]
    admin = admin_client(client)
    futures = admin.create_acls(bindings, request_timeout=client.remaining_s())
    outcome = results_or_errors(futures, lambda _: "creating the ACL", client)
    errors = {result for result in outcome.values() if isinstance(result, str)}
    if len(errors) == 1 and all(isinstance(result, str) for result in outcome.values()):
        # The same refusal of every ACL (no authorizer, not authorized) is one line, not a table of it.
        raise CliError(errors.pop())
    _print_acls([(b, "created" if not isinstance(outcome[b], str) else outcome[b]) for b in bindings])
    if any(isinstance(result, str) for result in outcome.values()):
        raise click.exceptions.Exit(1)


def _filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that pick ACLs (kafka-acls.sh's filters of --list and --remove), given to `command` as the one
    argument `filters`."""

    @functools.wraps(command)
    def with_filters(
        principal: str | None,
        host: str | None,
        operations: list[AclOperation],
        topics: tuple[str, ...],
        groups: tuple[str, ...],
        transactional_ids: tuple[str, ...],
        cluster: bool,
        pattern_type: str,
        **others: Any,
    ) -> Any:
        # One filter per resource and operation given (every resource or operation when none is).
        if len(operations) > 1:
            raise click.BadParameter("give at most one --operation", param_hint="--operation")
        pattern = _FILTER_PATTERN_TYPES[pattern_type.lower()]
        resources: list[tuple[ResourceType, str | None]] = list(_resources(topics, groups, transactional_ids, cluster))
        filters = [
            AclBindingFilter(
                resource_type,
                name,
                pattern,
                principal,
                host,
                operations[0] if operations else AclOperation.ANY,
                AclPermissionType.ANY,
            )
            for resource_type, name in resources or [(ResourceType.ANY, None)]
        ]
        return command(filters=filters, **others)

    decorated = click.option(
        "--resource-pattern-type",
        "pattern_type",
        type=click.Choice(sorted(_FILTER_PATTERN_TYPES), case_sensitive=False),
        default="any",
        show_default=True,
        help="any: ACLs on exactly the names given, whatever their pattern type; match: every ACL that covers "
        "them (the name, *, and the prefixes they start with); literal or prefixed: only that type.",
    )(with_filters)
    decorated = _resource_options(decorated)
    decorated = click.option(
        "--operation",
        "operations",
        multiple=True,
        callback=_operation,
        metavar="OPERATION",
        help="Only this operation.",
    )(decorated)
    decorated = click.option("--host", metavar="ADDRESS", help="Only ACLs for this host.")(decorated)
    return click.option(
        "--principal", metavar="TYPE:NAME", help="Only ACLs of this principal (User:* is its own principal)."
    )(decorated)


@acl.command(name="list")
@_filter_options
@client_options
def list_(filters: list[AclBindingFilter], client: ClientOptions) -> None:
    """List the ACLs, all of them or those matching the filters."""
    admin = admin_client(client)
    found: dict[AclBinding, None] = {}
    for acl_filter in filters:
        described = future_result(
            admin.describe_acls(acl_filter, request_timeout=client.remaining_s()), "listing ACLs", client
        )
        found.update(dict.fromkeys(described))
    if not found:
        _refuse_without_authorizer(admin, client)
    _print_acls([(b, None) for b in sorted(found, key=_cells)])


@acl.command()
@_filter_options
@click.option("--yes", is_flag=True, help="Delete without asking.")
@client_options
def delete(filters: list[AclBindingFilter], yes: bool, client: ClientOptions) -> None:
    """Delete the ACLs matching the filters (every ACL when none is given); asks first unless --yes."""
    if not yes:
        described = ", ".join(_describe_filter(f) for f in filters)
        click.confirm(f"Delete every ACL matching {described}?", abort=True, err=True)
    admin = admin_client(client)
    futures = admin.delete_acls(filters, request_timeout=client.remaining_s())
    deleted: dict[AclBinding, None] = {}
    for result in results_or_errors(futures, lambda _: "deleting ACLs", client).values():
        if isinstance(result, str):
            raise CliError(result)
        deleted.update(dict.fromkeys(result))
    _print_acls([(b, "deleted") for b in sorted(deleted, key=_cells)])


def _refuse_without_authorizer(admin: AdminClient, client: ClientOptions) -> None:
    """librdkafka drops the error of DescribeAcls, so a broker without an authorizer would look like one without
    ACLs: ask the broker's authorizer.class.name (when it may be asked) to tell the two apart."""
    try:
        metadata = admin.list_topics(timeout=client.remaining_s())
        resource = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(metadata.brokers))))
        configs = admin.describe_configs([resource], request_timeout=client.remaining_s())[resource].result(
            client.remaining_s()
        )
    except (KafkaException, StopIteration):
        return
    entry = configs.get("authorizer.class.name")
    if entry is not None and not entry.value:
        raise CliError(f"the broker has no authorizer: set authorizer.class.name={STANDARD_AUTHORIZER} to use ACLs")


def _cells(binding: AclBinding) -> tuple[str, ...]:
    """The ACL's row in Kafka's names, which is also the order the rows are listed in."""
    return (
        _resource_name(binding.restype),
        binding.name,
        binding.resource_pattern_type.name,
        binding.principal,
        binding.host,
        binding.operation.name,
        binding.permission_type.name,
    )


def _resource_name(resource_type: ResourceType) -> str:
    return _RESOURCE_NAMES.get(resource_type, resource_type.name)


def _describe_filter(acl_filter: AclBindingFilter) -> str:
    parts = [
        "every resource" if acl_filter.restype == ResourceType.ANY else _resource_name(acl_filter.restype).lower(),
    ]
    if acl_filter.name is not None:
        parts.append(f"{acl_filter.name!r} ({acl_filter.resource_pattern_type.name.lower()})")
    if acl_filter.principal is not None:
        parts.append(f"principal {acl_filter.principal}")
    if acl_filter.host is not None:
        parts.append(f"host {acl_filter.host}")
    if acl_filter.operation != AclOperation.ANY:
        parts.append(f"operation {acl_filter.operation.name}")
    return " ".join(parts)


def _print_acls(rows: list[tuple[AclBinding, str | None]]) -> None:
    """One row per ACL, in Kafka's names; with a STATUS column when `rows` carry one."""
    with_status = any(status is not None for _, status in rows)
    table = plain_table(
        "RESOURCE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION", *(("STATUS",) * with_status)
    )
    for binding, status in rows:
        cells: list[str | Text] = list(_cells(binding))
        if with_status:
            cells.append(Text(status or "", style="red" if status not in ("created", "deleted") else ""))
        table.add_row(*cells)
    output_console().print(table)
