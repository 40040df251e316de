"""The tables the commands print for a person, in rpk's plain style: by default the columns a person needs
most, few enough for an 80-column terminal; `-o wide` adds the rest. A value is never cut short with an
ellipsis: in a terminal too narrow for it, its cell folds onto the next line instead."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import click
from rich.table import Table
from rich.text import Text

from tierlog.cli.clients import output_console

# `-o/--output`, passed to the command as `output`: one of these.
TABLE = "table"
WIDE = "wide"

output_option = click.option(
    "-o",
    "--output",
    type=click.Choice([TABLE, WIDE]),
    default=TABLE,
    show_default=True,
    help="wide: every column (the default leaves out those an 80-column terminal has no room for).",
)

# `-i/--include-internal`, passed to the command as `include_internal`.
include_internal_option = click.option(
    "-i", "--include-internal", is_flag=True, help="Include internal topics (names starting with __)."
)


def is_internal(topic: str) -> bool:
    """Kafka's internal topics (`__consumer_offsets`, `__remote_log_metadata`, ...) start with two underscores."""
    return topic.startswith("__")


def plain_table(*columns: str, right: Collection[str] = (), title: str | None = None) -> Table:
    """A table without borders whose `columns` fold a value too long for the terminal rather than cut it;
    the columns named in `right` are right-aligned (numbers)."""
    table = Table(box=None, pad_edge=False, title=title, title_justify="left")
    for name in columns:
        add_column(table, name, right=name in right)
    return table


def add_column(table: Table, name: str, *, right: bool = False) -> None:
    table.add_column(name, justify="right" if right else "left", overflow="fold")


def print_status_table(column: str, outcome: Mapping[str, str | None], success: str) -> None:
    """A `column`/STATUS table, as rpk prints for create and delete: `success`, or the error (red) of each
    name that failed; exit 1 if any did."""
    console = output_console()
    table = plain_table(column, "STATUS")
    for name, error in outcome.items():
        table.add_row(name, success if error is None else Text(error, style="red"))
    console.print(table)
    if any(error is not None for error in outcome.values()):
        raise click.exceptions.Exit(1)
