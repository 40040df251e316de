"""The layering of docs/architecture.md#layers holds on the imports: import-linter's contracts in pyproject.toml
(every import points down, siblings of a layer are independent, no import cycles) are kept by the code, and
an import that breaks a rule makes the check fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the `tierlog` package under `root`, with the contracts of `root`/pyproject.toml."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": str(LINT_IMPORTS.parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_imports_keep_the_layers_and_have_no_cycles() -> None:
    checked = lint_imports(ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Contracts: 2 kept, 0 broken." in checked.stdout


@pytest.mark.parametrize(
    ("module", "added_import", "complaint"),
    [
        ("spark/source.py", "tierlog.server.kafka_apis", "tierlog.spark is not allowed to import tierlog.server"),
        (
            "replication/partition.py",
            "tierlog.controller.controller",
            "tierlog.replication is not allowed to import tierlog.controller",
        ),
        ("faults/workload.py", "tierlog.cli.main", "tierlog.faults is not allowed to import tierlog.cli"),
        ("storage/log.py", "tierlog.server.broker", "tierlog.storage is not allowed to import tierlog.server"),
        ("storage/checkpoints.py", "tierlog.storage.log", "No import cycles"),
    ],
)
def test_an_import_against_the_rules_is_refused(tmp_path: Path, module: str, added_import: str, complaint: str) -> None:
    shutil.copytree(ROOT / "tierlog", tmp_path / "tierlog", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    source = tmp_path / "tierlog" / module
    source.write_text(source.read_text() + f"\nimport {added_import}  # noqa: E402\n")
    checked = lint_imports(tmp_path)
    assert checked.returncode != 0, checked.stdout
    broken = checked.stdout[checked.stdout.index("Broken contracts") :]
    assert complaint in broken, checked.stdout
