"""One Spark class-data archive (backfill.spark.cds) for the whole test
session (a pytest plugin named in tests/conftest.py).

Tests marked ``spark`` start driver JVMs: the in-process session, every
``reorg worker`` process that runs a Spark subtask, every ``reorg submit``
of a Spark job type (its dry run). Without an archive each of those starts
loads and verifies Spark's classes from scratch (~8 s on 2 cores against
~4.5 s with one, docs/benchmarks.md). So the first such test builds the
archive once, in a session temp dir (never in $HOME), and
``REORG_SPARK_CDS`` points every process started after it there; child
processes inherit it, ``clean_env`` keeps it. Tests without the mark never
pay for the build, and until it ran ``REORG_SPARK_CDS=off`` (conftest)
keeps workers from building one of their own in the background.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def archive_for(directory: Path) -> Path | None:
    """The archive the session of a process in this environment would map
    with ``REORG_SPARK_CDS=directory``; None where it cannot have one (no java)."""
    from backfill.spark import session

    before = os.environ.get("REORG_SPARK_CDS")
    os.environ["REORG_SPARK_CDS"] = str(directory)
    try:
        return session.cds_archive(session.settings_from_env())
    finally:
        if before is None:
            del os.environ["REORG_SPARK_CDS"]
        else:
            os.environ["REORG_SPARK_CDS"] = before


@pytest.fixture(scope="session")
def spark_class_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """The session's archive, built by ``python -m backfill.spark.cds`` as a
    worker builds it; None (and JVMs start without one) if it cannot be.
    test_spark_cds checks this build's result."""
    directory = tmp_path_factory.mktemp("spark-cds")
    archive = archive_for(directory)
    if archive is None:
        yield None
        return
    built = subprocess.run([sys.executable, "-m", "backfill.spark.cds", str(archive)],
                           env={**os.environ, "REORG_SPARK_CDS": str(directory)}, cwd=REPO,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=600, check=False)
    if built.returncode != 0 or not archive.is_file():
        # Only a speed-up for the other tests; test_spark_cds fails on it.
        warnings.warn(f"no Spark class-data archive for the tests (exit {built.returncode}): "
                      f"{built.stderr[-500:]}", stacklevel=1)
        yield None
        return
    before = os.environ.get("REORG_SPARK_CDS")
    os.environ["REORG_SPARK_CDS"] = str(directory)
    yield archive
    if before is None:
        os.environ.pop("REORG_SPARK_CDS", None)
    else:
        os.environ["REORG_SPARK_CDS"] = before


@pytest.fixture(autouse=True)
def _spark_tests_share_the_class_archive(request: pytest.FixtureRequest) -> None:
    """Build the archive before the first test marked ``spark`` (and so
    before the in-process session, which that test may start)."""
    if request.node.get_closest_marker("spark") is not None:
        request.getfixturevalue("spark_class_archive")
