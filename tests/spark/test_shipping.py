"""What a job ships to a cluster's executors (tierlog.spark.shipping) and where the driver listens: no Spark
started, the zip imported as Spark's Python workers import it (a path entry ahead of site-packages)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tierlog.spark.pipeline import master_on_loopback
from tierlog.spark.shipping import PACKAGE_DIRECTORY, package_zip, runs_in_this_process


def test_the_zip_holds_the_tierlog_package_s_sources_and_data_without_bytecode(tmp_path: Path) -> None:
    archive = package_zip(tmp_path)
    names = zipfile.ZipFile(archive).namelist()
    sources = sorted(
        f"tierlog/{path.relative_to(PACKAGE_DIRECTORY).as_posix()}"
        for path in PACKAGE_DIRECTORY.rglob("*.py")
        if "__pycache__" not in path.parts
    )
    assert sorted(name for name in names if name.endswith(".py")) == sources
    assert "tierlog/spark/log4j2.properties" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_the_zip_depends_on_the_sources_alone(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert package_zip(tmp_path / "a").read_bytes() == package_zip(tmp_path / "b").read_bytes()


def test_tierlog_imports_from_the_zip_ahead_of_the_installed_package(tmp_path: Path) -> None:
    archive = package_zip(tmp_path)
    probe = (
        f"import sys; sys.path.insert(1, {str(archive)!r}); "
        "import tierlog.spark.source, tierlog.spark.record_kernels; print(tierlog.spark.source.__file__)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == f"{archive}/tierlog/spark/source.py"


@pytest.mark.parametrize(
    ("master", "local"),
    [("local", True), ("local[*]", True), ("local[2]", True), ("local[*,4]", True), ("spark://h:7077", False),
     ("yarn", False), ("k8s://https://api:6443", False), ("local-cluster[2,1,1024]", False)],
)  # fmt: skip
def test_only_local_masters_run_the_executors_in_the_driver(master: str, local: bool) -> None:
    assert runs_in_this_process(master) == local


@pytest.mark.parametrize(
    ("master", "loopback"),
    [("spark://127.0.0.1:7077", True), ("spark://localhost:7077", True), ("spark://[::1]:7077", True),
     ("spark://127.0.0.1:7077,127.0.0.1:7078", True), ("spark://10.0.0.5:7077", False),
     ("spark://127.0.0.1:7077,10.0.0.5:7077", False), ("spark://spark-master:7077", False), ("yarn", False)],
)  # fmt: skip
def test_a_driver_listens_on_loopback_only_when_its_master_is_there(master: str, loopback: bool) -> None:
    assert master_on_loopback(master) == loopback
