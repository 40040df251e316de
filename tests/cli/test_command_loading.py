"""Every command's module is imported only when that command runs: `tierlog --help` still lists every command, and
a broker's start imports none of the other commands (the clients, the simulator)."""

from __future__ import annotations

import subprocess
import sys

from cli_helpers import tierlog

COMMANDS = [
    "acl",
    "broker",
    "cluster",
    "consume",
    "demo",
    "dump-log",
    "groups",
    "log-dirs",
    "pipeline",
    "produce",
    "quorum",
    "sim",
    "topic",
    "trace",
    "transactions",
    "user",
]


def test_help_lists_every_command() -> None:
    ran = tierlog("--help")
    assert ran.code == 0, ran.stderr
    assert ran.first_line.startswith("Usage: tierlog [OPTIONS] COMMAND")
    listed = ran.stdout.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed if line.strip()] == COMMANDS


def test_a_subcommand_from_another_module_is_in_its_group() -> None:
    ran = tierlog("topic", "reassign", "--help")
    assert ran.code == 0, ran.stderr
    assert ran.first_line.startswith("Usage: tierlog topic reassign")
    ran = tierlog("cluster", "elect-leaders", "--help")
    assert ran.code == 0, ran.stderr
    assert ran.first_line.startswith("Usage: tierlog cluster elect-leaders")


def test_the_broker_command_imports_no_other_command() -> None:
    """What `tierlog broker` has imported when it starts the broker: its own modules, not the other commands'."""
    probe = (
        "import sys\n"
        "import tierlog.server.broker\n"
        "tierlog.server.broker.run_node = lambda config: None\n"
        "from tierlog.cli.main import cli\n"
        "cli(['broker', '--override', 'node.id=1'], standalone_mode=False)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tierlog.cli.', 'tierlog.sim', 'tierlog.spark'))))\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "['tierlog.cli.clients', 'tierlog.cli.main']"
