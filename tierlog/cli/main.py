"""The `tierlog` command."""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import click

from tierlog.config import KafkaConfig
from tierlog.config_def import ConfigException


def _command(module: str, name: str, *subcommands: tuple[str, str]) -> Callable[[], click.Command]:
    """A command imported when it is first asked for, with the subcommands that live in other modules."""

    @functools.cache
    def load() -> click.Command:
        command: click.Command = getattr(importlib.import_module(module), name)
        for sub_module, sub_name in subcommands:
            assert isinstance(command, click.Group)
            command.add_command(getattr(importlib.import_module(sub_module), sub_name))
        return command

    return load


# Each command's module is imported only when that command runs (or `--help` lists it): a broker's start imports
# the broker and nothing of the clients, the simulator or Spark (docs/performance.md#many-partitions).
_LAZY_COMMANDS: dict[str, Callable[[], click.Command]] = {
    "acl": _command("tierlog.cli.acl", "acl"),
    "cluster": _command(
        "tierlog.cli.cluster",
        "cluster",
        ("tierlog.cli.leaders", "elect_leaders"),
        ("tierlog.cli.scale", "rebalance"),
        ("tierlog.cli.scale", "add_broker"),
        ("tierlog.cli.scale", "decommission"),
    ),
    "consume": _command("tierlog.cli.consume", "consume"),
    "demo": _command("tierlog.cli.demo", "demo"),
    "groups": _command("tierlog.cli.groups", "groups"),
    "log-dirs": _command("tierlog.cli.log_dirs", "log_dirs"),
    "pipeline": _command("tierlog.cli.pipeline", "pipeline"),
    "produce": _command("tierlog.cli.produce", "produce"),
    "quorum": _command("tierlog.cli.quorum", "quorum"),
    "sim": _command("tierlog.cli.sim", "sim"),
    "topic": _command("tierlog.cli.topic", "topic", ("tierlog.cli.topic_reassign", "reassign")),
    "trace": _command("tierlog.cli.trace", "trace"),
    "transactions": _command("tierlog.cli.transactions", "transactions"),
    "user": _command("tierlog.cli.users", "user"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*self.commands, *_LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        load = _LAZY_COMMANDS.get(cmd_name)
        return load() if load is not None else super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    from tierlog.cli.clients import parse_key_values
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
    from tierlog.cli.dump_log import dump_log

    for path in files:
        try:
            dump_log(path, print_data_log=print_data_log, out=sys.stdout)
        except (OSError, ValueError) as e:
            raise click.ClickException(f"cannot dump {path}: {e}") from None


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
