"""One Spark class-data archive (backfill.spark.cds) for the whole test
session (a pytest plugin named in tests/conftest.py).

Tests marked ``spark`` start driver JVMs: the in-process session, every
``reorg worker`` process that runs a Spark subtask, every ``reorg submit``
of a Spark job type (its dry run). Without an archive each of those starts
loads and verifies Spark's classes from scratch (~8 s on 2 cores against
~4.5 s with one, docs/benchmarks.md). So the archive is built once, before
the first test marked ``spark`` that the process runs (outside its timeout:
the build takes a minute under load), in a session temp dir (never in
$HOME), and ``REORG_SPARK_CDS`` points every process started after it
there; child processes inherit it, ``clean_env`` keeps it. A process that
runs no such test never pays for the build (in a parallel run, every
process but the one given the ``one-process`` xdist group), and the workers
it starts keep ``REORG_SPARK_CDS=off`` (conftest): no build of their own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = "REORG_SPARK_CDS"

# "archive": the session's archive once built (None if the build failed or
# there is no java); "directory": where it is.
_built: dict[str, Path | None] = {}


def archive_for(directory: Path) -> Path | None:
    """The archive the session of a process in this environment would map
    with ``REORG_SPARK_CDS=directory``; None where it cannot have one (no java)."""
    from backfill.spark import session

    before = os.environ.get(ENV)
    os.environ[ENV] = str(directory)
    try:
        return session.cds_archive(session.settings_from_env())
    finally:
        if before is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = before


def build_session_archive() -> Path | None:
    """Build the archive as a worker builds it (``python -m backfill.spark.cds
    ARCHIVE``) and point ``REORG_SPARK_CDS`` at its directory; once a session."""
    if "archive" in _built:
        return _built["archive"]
    directory = _built["directory"] = Path(tempfile.mkdtemp(prefix="reorg-test-spark-cds-"))
    archive = archive_for(directory)
    if archive is not None:
        built = subprocess.run([sys.executable, "-m", "backfill.spark.cds", str(archive)],
                               env={**os.environ, ENV: str(directory)}, cwd=REPO,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=900, check=False)
        if built.returncode == 0 and archive.is_file():
            os.environ[ENV] = str(directory)
        else:
            # Only a speed-up for the other tests; test_spark_cds fails on it.
            warnings.warn(f"no Spark class-data archive for the tests (exit "
                          f"{built.returncode}): {built.stderr[-500:]}", stacklevel=1)
            archive = None
    _built["archive"] = archive
    return archive


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    # Before the first test marked ``spark`` this process runs, outside its
    # timeout (this wrapper is outermost): in a parallel run only the process
    # given the ``one-process`` group builds one, not every process that collected it.
    if item.get_closest_marker("spark"):
        build_session_archive()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish() -> Iterator[None]:
    yield
    directory = _built.get("directory")
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def spark_class_archive() -> Path | None:
    """The session's archive (None if it could not be built); built here if
    no test was marked ``spark`` (a test using the ``spark`` fixture alone)."""
    return build_session_archive()
