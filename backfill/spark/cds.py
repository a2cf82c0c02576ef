"""A class-data-sharing archive of Spark's classes, so the driver JVM starts faster.

Starting a SparkSession and its first job costs seconds, most of it loading
and verifying thousands of Spark classes. Java 17 can dump the classes a JVM
loaded into an archive (``-XX:ArchiveClassesAtExit``) and map it into later
JVMs (``-XX:SharedArchiveFile``): a session starts 1.7x faster and runs its
first job 1.6x faster (docs/benchmarks.md, "Measured apart").
That matters most for ``reorg submit``, whose dry run starts Spark in the
CLI process every time, and for a worker's start.

The archive is built once per host and setup (Java, PySpark, JDBC driver), in
a background child process started by a worker (``ensure_in_background``),
and renamed into place only after that child exited cleanly, so nobody ever
maps a half-written file. The JVM checks an archive against its own version
and class path and, on any mismatch, ignores it and starts as usual (its
warnings are switched off, they would go to the CLI's stdout); so a stale
archive costs speed, never correctness. ``REORG_SPARK_CDS=off`` disables it,
``REORG_SPARK_CDS=DIR`` moves it from ``~/.cache/reorg/spark-cds``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("reorg.spark.cds")

ENV = "REORG_SPARK_CDS"
# The JVM's CDS messages (class path mismatch, classes it skips while dumping)
# are warnings on stdout; reorg's output must stay clean.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xlog:class+path=off"


def archive_dir(environ: dict[str, str] | None = None) -> Path | None:
    """Where archives live; None when disabled."""
    value = (environ if environ is not None else os.environ).get(ENV, "").strip()
    if value.lower() in ("off", "0", "false", "no"):
        return None
    if value:
        return Path(value)
    return Path.home() / ".cache" / "reorg" / "spark-cds"


def archive_path(jdbc_driver: str, extra_class_path: str = "",
                 environ: dict[str, str] | None = None) -> Path | None:
    """This setup's archive (it may not exist yet); None when disabled or
    when there is no java to key it on."""
    root = archive_dir(environ)
    java = _java()
    if root is None or java is None:
        return None
    import pyspark

    # The JVM validates the archive itself; the key only keeps setups apart
    # and makes an upgraded Java or PySpark build a new one.
    key = "\0".join([str(java), str(java.stat().st_mtime_ns), pyspark.__version__,
                     jdbc_driver, extra_class_path])
    return root / f"spark-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def use_options(archive: Path | None) -> str:
    """JVM options that map ``archive`` if it exists, else nothing."""
    if archive is None or not archive.is_file():
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET}"


def discard(archive: Path) -> None:
    """Drop an archive a JVM failed to start with (the next build replaces it)."""
    with contextlib.suppress(OSError):
        archive.unlink()


def ensure_in_background(archive: Path | None, environ: dict[str, str] | None = None
                         ) -> subprocess.Popen[bytes] | None:
    """Start building ``archive`` in a detached, low-priority child unless it
    exists; the child takes a lock, so one build runs per archive per host.
    ``environ`` adds variables, e.g. the Spark settings the caller runs with,
    so that the training session has the caller's class path."""
    if archive is None or archive.is_file():
        return None
    archive.parent.mkdir(parents=True, exist_ok=True)
    log.info("building Spark class-data archive %s in the background", archive)
    return subprocess.Popen(
        [sys.executable, "-m", "backfill.spark.cds", str(archive)],
        env={**_child_env(), **(environ or {})},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=lambda: os.nice(10),  # noqa: PLW1509 - no threads yet in the child
    )


def build(archive: Path) -> bool:
    """Start Spark with ``-XX:ArchiveClassesAtExit``, run a job like a batch's,
    exit, and move the dump into place. True if the archive now exists."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another process is building it
        if archive.is_file():
            return True
        for stale in archive.parent.glob(f"{archive.stem}.*.partial"):
            stale.unlink(missing_ok=True)  # a killed build's; ours is the only one now
        partial = archive.with_suffix(f".{os.getpid()}.partial")
        # The dump happens when the JVM exits, so the training runs in a child
        # whose exit we can wait for.
        done = subprocess.run(
            [sys.executable, "-c", _TRAIN, str(partial)], env=_child_env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            check=False,
        )
        if done.returncode == 0 and partial.is_file() and partial.stat().st_size > 0:
            os.replace(partial, archive)
            return True
        with contextlib.suppress(OSError):
            partial.unlink()
        return False


# Runs in the training child: the session as reorg starts it (same settings,
# so the same class path, but always local: training must not take a
# cluster's executors), one Arrow job like a batch's, then a clean exit.
# The JVM dumps when it exits, which it does when its stdin closes; wait for it.
_TRAIN = """
import sys
from backfill.spark import session
session.DUMP_ARCHIVE = sys.argv[1]
spark = session.get_validation_spark()
df = spark.range(1000).selectExpr("id", "md5(cast(id AS string)) AS new", "CAST(NULL AS string) AS old")
df.where("id >= 10 AND id < 900").toArrow()
jvm = spark.sparkContext._gateway.proc
session.stop()
jvm.stdin.close()
sys.exit(jvm.wait(timeout=600))
"""


def _child_env() -> dict[str, str]:
    """This environment, with reorg importable even when it is not installed."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root}


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.is_file():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build reorg's Spark class-data archive.")
    parser.add_argument("archive", type=Path)
    args = parser.parse_args(argv)
    return 0 if build(args.archive) else 1


if __name__ == "__main__":
    sys.exit(main())
