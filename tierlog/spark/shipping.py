"""tierlog to a Spark cluster's executors: the driver's own tierlog package, zipped, as a Python file of the job.

On a cluster the executors' Python workers import tierlog to run the source's readers and the sink's writers
(the driver pickles them by reference to their modules). `ship_tierlog` adds a zip of the tierlog package the
driver runs (its sources and package data, no bytecode) with `SparkContext.addPyFile`, which is spark-submit's
`--py-files`: every executor fetches it and its Python workers put it on their path ahead of site-packages, so
the executors run exactly the driver's tierlog whether or not the workers have one installed. tierlog's
dependencies (pyarrow, numpy, numba, confluent-kafka, s3fs, ...) hold compiled extensions, which Python cannot
import from a zip: they must be installed in the workers' Python (docs/spark.md#on-a-spark-cluster).

`python -m tierlog.spark.shipping [DIRECTORY]` writes the zip and prints its path, for `spark-submit --py-files`.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark import SparkContext

ZIP_NAME = "tierlog.zip"
# The executors' Python workers' cache directory (XDG_CACHE_HOME), relative to their working directory: the
# executor's own, which goes with the application.
EXECUTOR_CACHE_DIR = "tierlog-cache"
# The directory of the tierlog package this module belongs to: what is zipped.
PACKAGE_DIRECTORY = Path(__file__).resolve().parents[1]
# A fixed time for every entry: the zip's bytes depend on the sources alone.
_ENTRY_TIME = (1980, 1, 1, 0, 0, 0)


def runs_in_this_process(master: str) -> bool:
    """Whether the master runs the executors inside the driver's JVM (`local`, `local[4]`, `local[*,2]`), where
    the Python workers import the driver's own tierlog and nothing needs shipping."""
    return master == "local" or master.startswith("local[")


def package_zip(directory: Path) -> Path:
    """Write `directory`/tierlog.zip: the tierlog package's files (no __pycache__) under `tierlog/`."""
    target = Path(directory) / ZIP_NAME
    files = sorted(
        path
        for path in PACKAGE_DIRECTORY.rglob("*")
        if path.is_file() and "__pycache__" not in path.relative_to(PACKAGE_DIRECTORY).parts
    )
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            name = (Path("tierlog") / path.relative_to(PACKAGE_DIRECTORY)).as_posix()
            archive.writestr(zipfile.ZipInfo(name, _ENTRY_TIME), path.read_bytes(), zipfile.ZIP_DEFLATED)
    return target


def ship_tierlog(context: SparkContext) -> Path | None:
    """Add the driver's tierlog to the job's Python files when the master runs executors elsewhere (a cluster);
    returns the zip, or None for a local master. Call it before registering the data source: a Python function
    carries the job's Python files as they are when it is made."""
    if runs_in_this_process(context.master):
        return None
    directory = Path(tempfile.mkdtemp(prefix="tierlog-shipped-"))
    # Spark's file server reads the zip whenever an executor joins, for as long as the driver runs.
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    archive = package_zip(directory)
    context.addPyFile(str(archive))
    # numba caches the converter's kernels (tierlog.spark.record_kernels) imported from a zip in the user's
    # cache directory, under a name made from the zip's path, which is new for every job: in the user's home
    # that would be a directory left behind per job and executor; in the executor's directory it goes with it.
    context.environment.setdefault("XDG_CACHE_HOME", EXECUTOR_CACHE_DIR)
    return archive


def main() -> None:
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    directory.mkdir(parents=True, exist_ok=True)
    print(package_zip(directory))


if __name__ == "__main__":
    main()
