"""`tierlog --version` prints the installed package's version."""

from __future__ import annotations

from importlib.metadata import version

from cli_helpers import tierlog


def test_version_is_the_packages() -> None:
    ran = tierlog("--version")
    assert ran.code == 0, ran.stderr
    assert ran.first_line == f"tierlog {version('tierlog')}"
