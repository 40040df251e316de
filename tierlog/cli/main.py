"""The `tierlog` command."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from tierlog.config import ConfigError, KafkaConfig


def _parse_overrides(values: tuple[str, ...]) -> dict[str, str]:
    overrides = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not of the form key=value", param_hint="--override")
        overrides[key.strip()] = value.strip()
    return overrides


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    """Run a broker. Without CONFIG_FILE it serves 127.0.0.1:9092 with data in /tmp/tierlog-logs."""
    from tierlog.server.broker import run_broker

    logging.basicConfig(
        level=log_level.upper(),
        format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)",
        stream=sys.stderr,
    )
    try:
        config = KafkaConfig.from_file(config_file, _parse_overrides(overrides))
        run_broker(config)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"cannot start the broker: {e}") from None


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
