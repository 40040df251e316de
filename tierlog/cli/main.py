"""The `tierlog` command."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from tierlog.cli.acl import acl
from tierlog.cli.clients import parse_key_values
from tierlog.cli.cluster import cluster
from tierlog.cli.consume import consume
from tierlog.cli.demo import demo
from tierlog.cli.dump_log import dump_log
from tierlog.cli.groups import groups
from tierlog.cli.leaders import elect_leaders
from tierlog.cli.log_dirs import log_dirs
from tierlog.cli.pipeline import pipeline
from tierlog.cli.produce import produce
from tierlog.cli.quorum import quorum
from tierlog.cli.scale import add_broker, decommission, rebalance
from tierlog.cli.sim import sim
from tierlog.cli.topic import topic
from tierlog.cli.topic_reassign import reassign
from tierlog.cli.trace import trace
from tierlog.cli.transactions import transactions
from tierlog.cli.users import user
from tierlog.config import KafkaConfig
from tierlog.config_def import ConfigException


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tierlog", message="%(prog)s %(version)s")
def cli() -> None:
    """tierlog: a Kafka-compatible, replicated, tiered commit log."""


@cli.command()
@click.argument("config_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--override",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a server.properties value (repeatable), as kafka-server-start.sh --override.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def broker(config_file: Path | None, overrides: tuple[str, ...], log_level: str) -> None:
    """Run a broker (or, with process.roles=controller, a dedicated controller). Without CONFIG_FILE it serves
    127.0.0.1:9092 with data in /tmp/tierlog-logs."""
    from tierlog.server.broker import run_node
    from tierlog.server.startup import StartupError

    logging.basicConfig(
        level=log_level.upper(),
        format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)",
        stream=sys.stderr,
    )
    try:
        config = KafkaConfig.from_file(config_file, dict(parse_key_values(overrides, "--override")))
        run_node(config)
    except (ConfigException, StartupError) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"the broker stopped on an I/O error: {e}") from None


@cli.command(name="dump-log")
@click.option(
    "--files",
    "files",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A .log, .index, .timeindex, .snapshot, metadata snapshot (.checkpoint) or leader-epoch checkpoint "
    "file, by its local name or by its remote-tier object name (repeatable).",
)
@click.option("--print-data-log", is_flag=True, help="Also print every record (key, payload, headers).")
def dump_log_command(files: tuple[Path, ...], print_data_log: bool) -> None:
    """Print segment, index, producer snapshot and metadata snapshot files as kafka-dump-log.sh does, from a
    broker's disk or from the remote tier (its object names), and leader-epoch checkpoints."""
    for path in files:
        try:
            dump_log(path, print_data_log=print_data_log, out=sys.stdout)
        except (OSError, ValueError) as e:
            raise click.ClickException(f"cannot dump {path}: {e}") from None


topic.add_command(reassign)
cli.add_command(topic)
cli.add_command(produce)
cli.add_command(consume)
cli.add_command(groups)
cli.add_command(transactions)
cli.add_command(acl)
cli.add_command(demo)
cluster.add_command(elect_leaders)
cluster.add_command(rebalance)
cluster.add_command(add_broker)
cluster.add_command(decommission)
cli.add_command(cluster)
cli.add_command(quorum)
cli.add_command(trace)
cli.add_command(pipeline)
cli.add_command(sim)
cli.add_command(user)
cli.add_command(log_dirs)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
