"""The Spark class-data archive (backfill.spark.cds): built once, mapped by
later driver JVMs, harmless when stale or broken, silent on stdout.

Each test starts real JVMs in child processes (the archive is only read at
JVM start, and the session of this test process is already up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backfill.spark import cds

REPO = Path(__file__).resolve().parents[2]

# Starts the session as reorg does, runs a job, and reports whether the
# driver JVM mapped the archive (its /proc maps name the file).
_PROBE = """
import sys
from backfill.spark import session
spark = session.get_spark()
rows = spark.range(5).selectExpr("md5(cast(id AS string)) AS m").toArrow().num_rows
pid = spark.sparkContext._gateway.proc.pid
archive = str(session.cds_archive())
with open(f"/proc/{pid}/maps") as maps:
    mapped = any(archive in line for line in maps)
print(f"rows={rows} mapped={mapped}")
"""


def _env(archives: Path | str) -> dict[str, str]:
    return {**os.environ, "REORG_SPARK_CDS": str(archives),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _probe(archives: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PROBE], env=_env(archives), cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


def _archive(archives: Path) -> Path:
    out = subprocess.run(
        [sys.executable, "-c", "from backfill.spark import session; print(session.cds_archive())"],
        env=_env(archives), cwd=REPO, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.mark.spark
def test_archive_is_built_once_then_mapped_with_clean_stdout(spark_class_archive):
    """The session's archive (support.spark_archive) was built as a worker
    builds it, ``python -m backfill.spark.cds ARCHIVE``, into the directory
    ``REORG_SPARK_CDS`` names; a JVM started there maps it."""
    archive = spark_class_archive
    assert archive is not None, "the session's build failed: see the warnings summary"
    archives = archive.parent
    assert _archive(archives) == archive
    assert archive.is_file() and archive.stat().st_size > 1_000_000
    assert not list(archives.glob("*.partial")), "a finished build leaves no partial dump"

    built_at = archive.stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-m", "backfill.spark.cds", str(archive)],
                           env=_env(archives), cwd=REPO, timeout=600, check=False)
    assert again.returncode == 0 and archive.stat().st_mtime_ns == built_at  # built once

    probe = _probe(archives)
    # Only our line: the JVM's CDS warnings must not reach reorg's stdout.
    assert probe.stdout.strip() == "rows=5 mapped=True", probe.stderr[-2000:]


@pytest.mark.matrix  # a JVM start of its own; the archive's use is tested above
def test_a_corrupt_archive_is_ignored_and_spark_still_starts(tmp_path):
    archive = _archive(tmp_path)
    archive.write_bytes(b"not a class-data archive" * 1000)
    probe = _probe(tmp_path)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip() == "rows=5 mapped=False"


def test_spark_failing_for_another_reason_keeps_the_archive(tmp_path):
    """A JVM that cannot start at all (here: a second garbage collector in
    --spark-conf) says so, and leaves the archive for the fixed setup."""
    archive = _archive(tmp_path)
    archive.write_bytes(b"stands in for a good archive" * 1000)
    env = {**_env(tmp_path), "REORG_SPARK_CONF": "spark.driver.extraJavaOptions=-XX:+UseSerialGC"}
    probe = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=300, check=False)
    assert probe.returncode != 0 and "Spark did not start" in probe.stderr
    assert archive.is_file()


def test_off_disables_it():
    assert cds.archive_dir({"REORG_SPARK_CDS": "off"}) is None
    assert cds.archive_path("x.jar", environ={"REORG_SPARK_CDS": "off"}) is None
    assert cds.use_options(None) == ""


def test_a_second_build_while_one_runs_does_nothing(tmp_path):
    import fcntl

    archive = tmp_path / "spark-x.jsa"
    with open(archive.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert cds.build(archive) is False
    assert not archive.exists()


@pytest.mark.parametrize("key_part", ["jdbc", "class_path"])
def test_setups_get_their_own_archive(tmp_path, key_part):
    env = {"REORG_SPARK_CDS": str(tmp_path)}
    base = cds.archive_path("a.jar", "", env)
    other = (cds.archive_path("b.jar", "", env) if key_part == "jdbc"
             else cds.archive_path("a.jar", "/extra/*", env))
    assert base is not None and other is not None and base != other
