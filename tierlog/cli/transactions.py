"""`tierlog transactions list|describe`: the transactions the coordinators know, as `kafka-transactions.sh` shows
them (docs/transactions.md#cli).

As Kafka's TransactionsCommand: `list` asks every broker DescribeCluster names for ListTransactions (each answers for
the `__transaction_state` partitions it leads) and prints TransactionalId, Coordinator, ProducerId and
TransactionState; `describe` finds the transactional id's coordinator (FindCoordinator, key type 1) and prints its
DescribeTransactions answer: CoordinatorId, TransactionalId, ProducerId, ProducerEpoch, TransactionState,
TransactionTimeoutMs, CurrentTransactionStartTimeMs, TransactionDurationMs (None when no transaction is running) and
TopicPartitions.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    bootstrap_addresses,
    client_options,
    ensure_reachable,
    output_console,
)
from tierlog.cli.log_dirs import BrokerAddress, cluster_brokers
from tierlog.cli.tables import plain_table
from tierlog.client.connection import ApiNotServedError, KafkaConnectionError, ask_once
from tierlog.client.requests import (
    API_DESCRIBE_TRANSACTIONS,
    API_FIND_COORDINATOR,
    API_LIST_TRANSACTIONS,
    COORDINATOR_KEY_TRANSACTION,
    DESCRIBE_TRANSACTIONS_VERSION,
    FIND_COORDINATOR_VERSION,
    LIST_TRANSACTIONS_VERSION,
    describe_transactions_request,
    find_coordinator_request,
    list_transactions_request,
)
from tierlog.client.security import ClientSecurity
from tierlog.protocol.errors import error_code

CLIENT_ID = "transactions-tool"
# The coordinator may still be loading its partition, or __transaction_state being created: Kafka's admin client
# asks again after retry.backoff.ms.
RETRIABLE = frozenset({"COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"})
RETRY_BACKOFF_S = 0.1
LIST_COLUMNS = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
DESCRIBE_COLUMNS = (
    "CoordinatorId",
    "TransactionalId",
    "ProducerId",
    "ProducerEpoch",
    "TransactionState",
    "TransactionTimeoutMs",
    "CurrentTransactionStartTimeMs",
    "TransactionDurationMs",
    "TopicPartitions",
)


def _error(code: Any) -> str | None:
    return None if code == error_code(None) else code.name.upper()


async def _ask(
    broker: BrokerAddress,
    security: ClientSecurity,
    timeout_s: float,
    api_key: int,
    build: Callable[[int], Any],
    newest: int,
) -> Any:
    return await ask_once(
        broker.host, broker.port, api_key, build, newest, client_id=CLIENT_ID, timeout_s=timeout_s, security=security
    )


@dataclass(frozen=True)
class Listing:
    transactional_id: str
    coordinator: int
    producer_id: int
    state: str


async def list_transactions(
    bootstrap: str, security: ClientSecurity, duration_filter_ms: int, timeout_s: float
) -> list[Listing]:
    """Every broker's transactions; CliError for a broker that cannot answer (Kafka's command fails too)."""
    brokers = await cluster_brokers(bootstrap, security, timeout_s)
    # Version 0 has no duration filter: a broker that serves only v0 can answer only an unfiltered listing.
    newest = LIST_TRANSACTIONS_VERSION if duration_filter_ms >= 0 else 0

    def build(version: int) -> Any:
        return list_transactions_request(duration_filter_ms=duration_filter_ms, version=version)

    async def ask(broker: BrokerAddress) -> list[Listing]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                response = await _ask(broker, security, timeout_s, API_LIST_TRANSACTIONS, build, newest)
            except (KafkaConnectionError, ApiNotServedError) as e:
                raise CliError(f"Failed to list transactions: broker {broker.node_id}: {e}") from None
            error = _error(response.error_code)
            if error in RETRIABLE and loop.time() + RETRY_BACKOFF_S < deadline:
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            if error is not None:
                raise CliError(f"Failed to list transactions: broker {broker.node_id} answers {error}")
            return [
                Listing(str(t.transactional_id), broker.node_id, int(t.producer_id), str(t.transaction_state))
                for t in response.transaction_states
            ]

    answers = await asyncio.wait_for(asyncio.gather(*(ask(b) for b in brokers)), timeout_s)
    return [listing for answer in answers for listing in answer]


async def find_transaction_coordinator(
    bootstrap: str, security: ClientSecurity, transactional_id: str, timeout_s: float
) -> BrokerAddress:
    """The id's coordinator, asked of the bootstrap servers in turn (FindCoordinator, key type 1) until one names it
    or answers an error that is not retriable."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    servers = [BrokerAddress(-1, host, port) for host, port in bootstrap_addresses(bootstrap)]
    said = ""
    for attempt in itertools.count():
        server = servers[attempt % len(servers)]
        try:
            response = await _ask(
                server,
                security,
                timeout_s,
                API_FIND_COORDINATOR,
                lambda version: find_coordinator_request(
                    transactional_id, COORDINATOR_KEY_TRANSACTION, version=version
                ),
                FIND_COORDINATOR_VERSION,
            )
        except KafkaConnectionError as e:
            said = str(e)
        else:
            # v4 answers each key in `coordinators`; older versions at the top level.
            found = response.coordinators[0] if getattr(response, "coordinators", ()) else response
            error = _error(found.error_code)
            if error is None:
                return BrokerAddress(int(found.node_id), str(found.host), int(found.port))
            said = f"{error}: {found.error_message}" if found.error_message else error
            if error not in RETRIABLE:
                break
        if loop.time() + RETRY_BACKOFF_S >= deadline:
            break
        await asyncio.sleep(RETRY_BACKOFF_S)
    raise CliError(f"Failed to describe transaction state of transactional-id `{transactional_id}`: {said}")


async def describe_transaction(
    bootstrap: str, security: ClientSecurity, transactional_id: str, timeout_s: float
) -> tuple[int, Any]:
    """(coordinator id, the DescribeTransactions TransactionState), asking again while the coordinator loads."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        coordinator = await find_transaction_coordinator(bootstrap, security, transactional_id, timeout_s)
        response = await _ask(
            coordinator,
            security,
            timeout_s,
            API_DESCRIBE_TRANSACTIONS,
            lambda version: describe_transactions_request([transactional_id], version=version),
            DESCRIBE_TRANSACTIONS_VERSION,
        )
        (state,) = response.transaction_states
        error = _error(state.error_code)
        if error in RETRIABLE and loop.time() + RETRY_BACKOFF_S < deadline:
            await asyncio.sleep(RETRY_BACKOFF_S)
            continue
        if error is not None:
            raise CliError(f"Failed to describe transaction state of transactional-id `{transactional_id}`: {error}")
        return coordinator.node_id, state


def describe_row(coordinator: int, state: Any, now_ms: int) -> list[str]:
    # Kafka's admin client: a start time < 0 is none (no transaction has started).
    start_ms = state.transaction_start_time_ms if state.transaction_start_time_ms >= 0 else None
    partitions = ",".join(f"{t.topic}-{p}" for t in state.topics for p in t.partitions)
    return [
        str(coordinator),
        str(state.transactional_id),
        str(state.producer_id),
        str(state.producer_epoch),
        str(state.transaction_state),
        str(round(state.transaction_timeout.total_seconds() * 1000)),
        "None" if start_ms is None else str(start_ms),
        "None" if start_ms is None else str(now_ms - start_ms),
        partitions,
    ]


def _run(coroutine: Any, client: ClientOptions) -> Any:
    try:
        return asyncio.run(coroutine)
    except TimeoutError:
        raise CliError(f"no answer within --timeout ({client.timeout_s:g}s)") from None
    except (KafkaConnectionError, ApiNotServedError) as e:
        raise CliError(str(e)) from None


@click.group()
def transactions() -> None:
    """List and describe transactions, as kafka-transactions.sh."""


@transactions.command(name="list")
@client_options
@click.option(
    "--duration-filter",
    type=int,
    default=None,
    metavar="MS",
    help="Only transactions running longer than this (ms); < 0: all.",
)
def list_(client: ClientOptions, duration_filter: int | None) -> None:
    """Every transactional id the coordinators know, with its coordinator, producer id and state."""
    security = client.security()
    ensure_reachable(client.bootstrap, client.remaining_s(), security)
    duration = -1 if duration_filter is None or duration_filter < 0 else duration_filter
    listings = _run(list_transactions(client.bootstrap, security, duration, client.remaining_s()), client)
    table = plain_table(*LIST_COLUMNS, right=("Coordinator", "ProducerId"))
    for listing in sorted(listings, key=lambda t: (t.coordinator, t.transactional_id)):
        table.add_row(listing.transactional_id, str(listing.coordinator), str(listing.producer_id), listing.state)
    output_console().print(table)


@transactions.command()
@client_options
@click.option("--transactional-id", required=True, help="The transactional id to describe.")
def describe(client: ClientOptions, transactional_id: str) -> None:
    """A transactional id's producer id and epoch, state, timeout, the current transaction's start and duration
    and its partitions, from its coordinator."""
    security = client.security()
    ensure_reachable(client.bootstrap, client.remaining_s(), security)
    coordinator, state = _run(
        describe_transaction(client.bootstrap, security, transactional_id, client.remaining_s()), client
    )
    table = plain_table(*DESCRIBE_COLUMNS)
    table.add_row(*describe_row(coordinator, state, round(time.time() * 1000)))
    output_console().print(table)
