"""One SparkSession per process, created lazily on first use and then reused.

Spark costs seconds to start, so a worker starts it once and runs every
subtask on it. ``configure`` (from the CLI's ``--spark-master`` /
``--spark-conf``) must come before the first ``get_spark``; without it the
settings come from the environment:

    REORG_SPARK_MASTER   master URL, default ``local[*]``
    REORG_SPARK_CONF     extra ``key=value`` settings, separated by ``;`` or newlines
    REORG_JDBC_JAR       the PostgreSQL JDBC driver: a jar path, or Maven coordinates
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from backfill.spark import cds
from framework.errors import one_line

if TYPE_CHECKING:  # importing pyspark is cheap, but keep even that off the import path
    from pyspark.sql import SparkSession

log = logging.getLogger("reorg.spark")

DEFAULT_MASTER = "local[*]"
DRIVER_CLASS = "org.postgresql.Driver"
DRIVER_PACKAGE = "org.postgresql:postgresql:42.7.4"
SYSTEM_JAR = Path("/usr/share/java/postgresql.jar")
HOW_TO_PROVIDE = (
    "set REORG_JDBC_JAR=/path/to/postgresql.jar (or `apt-get install libpostgresql-jdbc-java`, "
    "or put it in ~/.m2/repository/org/postgresql/postgresql/)"
)

# Our defaults; --spark-conf may override all but the FORCED ones.
_DEFAULTS = {
    "spark.app.name": "reorg",
    # Batches are small and bounded: few shuffle partitions, no UI port per worker.
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # One clock for timestamps read over JDBC and written back through Arrow.
    "spark.sql.session.timeZone": "UTC",
    # Batch plans are a range scan and a projection: adaptive execution has
    # nothing to re-plan and costs ~20 ms of driver CPU per batch.
    "spark.sql.adaptive.enabled": "false",
    # PySpark's DataFrame debugging records the Python call site of every
    # DataFrame API call: a JVM round trip for a setting, a walk of the stack
    # and an attempt to import IPython and ipykernel, per call (the first one
    # imported 460 modules, ~0.3 s of a first analysis). The call sites would
    # name reorg's own lines, never the user's expression.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}
# A speculative duplicate task would read and land a batch twice; the merge is
# fenced, but the work and the locks are not free. Never on for database sinks.
_FORCED = {"spark.speculation": "false"}

# Errors only, to stderr (the worker's own log stays readable).
_LOG4J = """\
rootLogger.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def quiet_log_config(name: str) -> str:
    """``_LOG4J`` written to ``name`` in the temporary directory; its path,
    for ``build_conf``."""
    path = Path(tempfile.gettempdir()) / name
    path.write_text(_LOG4J)
    return str(path)


class SparkUnavailable(RuntimeError):
    """Spark could not start or has no JDBC driver; the message is one line saying how to fix it."""


class _JvmDidNotStart(SparkUnavailable):
    pass


@dataclass(frozen=True)
class JdbcDriver:
    kind: str  # "jar" (a local file for spark.jars) or "packages" (coordinates for spark.jars.packages)
    value: str


@dataclass(frozen=True)
class SparkSettings:
    master: str = DEFAULT_MASTER
    conf: Mapping[str, str] = field(default_factory=dict)
    jdbc_jar: str | None = None  # path or Maven coordinates; None means discover

    @property
    def local(self) -> bool:
        return self.master.startswith("local")


def parse_conf_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` from ``--spark-conf`` into a dict, with a one-line error."""
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise SparkUnavailable(
                f"--spark-conf {pair!r} is not KEY=VALUE with a spark.* key, "
                "e.g. --spark-conf spark.driver.memory=2g"
            )
        conf[key.strip()] = value.strip()
    return conf


def settings_from_env(environ: Mapping[str, str] = os.environ) -> SparkSettings:
    raw = environ.get("REORG_SPARK_CONF", "")
    pairs = [p for p in re.split(r"[;\n]", raw) if p.strip()]
    return SparkSettings(
        master=environ.get("REORG_SPARK_MASTER") or DEFAULT_MASTER,
        conf=parse_conf_pairs(pairs),
        jdbc_jar=environ.get("REORG_JDBC_JAR") or None,
    )


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(p) for p in re.findall(r"\d+", version))


def find_jdbc_driver(explicit: str | None = None, home: Path | None = None,
                     system_jar: Path = SYSTEM_JAR) -> JdbcDriver:
    """Explicit setting, then the local Maven repository (newest), then the
    Debian package's jar, then Maven coordinates for Spark to resolve."""
    if explicit:
        if Path(explicit).is_file():
            return JdbcDriver("jar", str(Path(explicit).resolve()))
        if re.fullmatch(r"[\w.\-]+:[\w.\-]+:[\w.\-]+", explicit):
            return JdbcDriver("packages", explicit)
        raise SparkUnavailable(f"REORG_JDBC_JAR={explicit} is neither a file nor Maven coordinates; "
                               + HOW_TO_PROVIDE)
    repo = (home or Path.home()) / ".m2/repository/org/postgresql/postgresql"
    jars = [j for j in glob.glob(str(repo / "*" / "postgresql-*.jar"))
            if not j.endswith(("-sources.jar", "-javadoc.jar"))]
    if jars:
        return JdbcDriver("jar", max(jars, key=_version_key))
    if system_jar.is_file():
        return JdbcDriver("jar", str(system_jar))
    return JdbcDriver("packages", DRIVER_PACKAGE)


def build_conf(settings: SparkSettings, driver: JdbcDriver, log4j_file: str,
               jvm_options: str = "") -> dict[str, str]:
    """Every setting the session starts with (pure, so tests can read it);
    ``jvm_options`` go to the driver JVM (the class-data archive's)."""
    conf = {**_DEFAULTS, "spark.master": settings.master}
    # Parallel GC: the driver's garbage is short-lived batch data; on a 2-core
    # machine it cost a third less CPU than G1 for the same backfill.
    java_opts = (f"-XX:+UseParallelGC -Duser.timezone=UTC "
                 f"-Dlog4j2.configurationFile=file:{log4j_file} {jvm_options}").strip()
    conf["spark.driver.extraJavaOptions"] = java_opts
    conf["spark.executor.extraJavaOptions"] = "-Duser.timezone=UTC"
    if settings.local:
        # Spark otherwise binds the driver to the host's external address.
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
    conf["spark.jars" if driver.kind == "jar" else "spark.jars.packages"] = driver.value
    for key, value in settings.conf.items():
        # Java options add to ours (time zone, quiet log config) instead of replacing them.
        conf[key] = f"{conf[key]} {value}" if key.endswith("extraJavaOptions") and key in conf else value
    for key, value in _FORCED.items():
        if conf.get(key, value) != value:
            log.warning("ignoring %s=%s: reorg keeps it %s", key, conf[key], value)
        conf[key] = value
    return conf


# A session a command starts for one dry run (``reorg submit`` of a Spark job
# type) lives for seconds. C2, the JIT's optimising tier, compiles code such a
# JVM never runs long enough to repay it: without C2 that JVM takes half the
# CPU and starts sooner (docs/benchmarks.md, "Measured apart"). A worker's
# session runs batches for hours and keeps C2.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"

_lock = threading.Lock()
# Set only in cds's training child: dump the classes to this path at exit.
DUMP_ARCHIVE: str | None = None
_settings: SparkSettings | None = None
_spark: SparkSession | None = None
# Set when the session is a command's, for one dry run: see SHORT_LIVED_JVM.
_short_lived = False
_stop_hooks: list[Callable[[], None]] = []


def on_session_stop(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the session stops: caches of DataFrames or registered
    UDFs belong to one session and must not outlive it."""
    _stop_hooks.append(hook)


def configure(settings: SparkSettings) -> None:
    """Use these settings for the session; only before it has started."""
    global _settings
    with _lock:
        if _spark is not None and settings != _settings:
            raise SparkUnavailable("Spark already started in this process; configure it before first use")
        _settings = settings


def started() -> bool:
    return _spark is not None


def get_spark() -> SparkSession:
    """The process's SparkSession, started on first call (several seconds),
    and started again if its JVM has died (killed, out of memory)."""
    global _spark, _settings
    spark = _spark
    if spark is not None and _jvm_alive(spark):
        return spark
    with _lock:
        if _spark is not None and not _jvm_alive(_spark):
            _forget_dead_session(_spark)
        if _spark is None:
            _settings = _settings or settings_from_env()
            _spark = _start(_settings)
        return _spark


def alive(spark: SparkSession) -> bool:
    """False once ``spark``'s JVM has exited; ``get_spark`` then starts a new
    session, and work on this one can only be retried on that."""
    return _jvm_alive(spark)


def _jvm_alive(spark: SparkSession) -> bool:
    # The JVM PySpark launched is its gateway's child process.
    proc = getattr(spark.sparkContext._gateway, "proc", None)  # noqa: SLF001
    return proc is None or not _exited(proc)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether a child process has exited. ``Popen.poll`` answers "running"
    while another thread is inside its own poll of the same process (it will
    not wait for that thread's lock), which made a subtask that saw the JVM
    die judge it alive and fail for good instead of being retried; so a
    "running" answer is checked against the process's state in /proc (a
    zombie has exited) where there is one."""
    if proc.poll() is not None:
        return True
    try:
        with open(f"/proc/{proc.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return os.path.isdir("/proc/self")  # no entry on a system with /proc: reaped
    except (OSError, IndexError):
        return False


def _forget_dead_session(spark: SparkSession) -> None:
    """Drop a session whose JVM is gone, so that a new one can start.

    ``SparkSession.stop`` would call into the dead JVM and fail before
    clearing PySpark's class-level singletons, which a new session would then
    reuse (the dead gateway among them); so clear them here."""
    global _spark
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = spark.sparkContext._gateway  # noqa: SLF001
    proc = getattr(gateway, "proc", None)
    log.warning("Spark's JVM (pid %s) exited with code %s; starting a new session",
                getattr(proc, "pid", "?"), getattr(proc, "returncode", "?"))
    with contextlib.suppress(Exception):
        spark.sparkContext.stop()  # its Python side (servers, threads); JVM calls fail
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.close()  # the old gateway's sockets and callback server
    SparkContext._gateway = None  # noqa: SLF001
    SparkContext._jvm = None  # noqa: SLF001
    SparkContext._active_spark_context = None  # noqa: SLF001
    SparkSession._instantiatedSession = None  # noqa: SLF001
    SparkSession._activeSession = None  # noqa: SLF001
    _spark = None
    for hook in _stop_hooks:
        hook()


def get_validation_spark() -> SparkSession:
    """The session for submit-time checks: the process's own if it has one,
    else one started locally even where workers use a cluster. The checks
    analyse expressions and dry-run a few rows; they must not queue for a
    cluster's executors, or need the CLI's host to be reachable from them."""
    global _settings, _short_lived
    with _lock:
        if _spark is None:
            # Nobody configured Spark in this process (a worker does, before
            # its node starts): it is a command, whose session ends with it.
            _short_lived = _settings is None
            _settings = validation_settings(_settings or settings_from_env())
    return get_spark()


def validation_settings(settings: SparkSettings) -> SparkSettings:
    """``settings`` with a local master; the rest stays (the class path must
    match the workers', so their class-data archive fits)."""
    return settings if settings.local else replace(settings, master=DEFAULT_MASTER)


def settings_environ(settings: SparkSettings | None = None) -> dict[str, str]:
    """The session's settings as the variables ``settings_from_env`` reads,
    for a child process that must start Spark the same way."""
    settings = settings or _settings or settings_from_env()
    environ = {"REORG_SPARK_MASTER": settings.master,
               "REORG_SPARK_CONF": ";".join(f"{k}={v}" for k, v in settings.conf.items())}
    if settings.jdbc_jar:
        environ["REORG_JDBC_JAR"] = settings.jdbc_jar
    return environ


def cds_archive(settings: SparkSettings | None = None) -> Path | None:
    """The class-data archive this process's session would use (it may not
    exist yet); None when disabled."""
    settings = settings or _settings or settings_from_env()
    driver = find_jdbc_driver(settings.jdbc_jar)
    return cds.archive_path(driver.value, settings.conf.get("spark.driver.extraClassPath", ""))


def _start(settings: SparkSettings) -> SparkSession:
    driver = find_jdbc_driver(settings.jdbc_jar)
    if DUMP_ARCHIVE:
        jvm_options, archive = f"-XX:ArchiveClassesAtExit={DUMP_ARCHIVE} {cds.QUIET}", None
    else:
        archive = cds_archive(settings)
        jvm_options = cds.use_options(archive)
    if _short_lived:
        jvm_options = f"{SHORT_LIVED_JVM} {jvm_options}".strip()
    try:
        return _launch(settings, driver, jvm_options)
    except _JvmDidNotStart:
        if not jvm_options or archive is None:
            raise
        # The JVM ignores an archive that does not match it, so this should not
        # happen; if it does, try without. Only when that works was the archive
        # the cause (not, say, a bad --spark-conf): then drop it.
        log.warning("Spark did not start with class-data archive %s; retrying without it",
                    archive)
        spark = _launch(settings, driver, "")
        cds.discard(archive)
        return spark


def _launch(settings: SparkSettings, driver: JdbcDriver, jvm_options: str) -> SparkSession:
    log4j = quiet_log_config("reorg-spark-log4j2.properties")
    if settings.local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python UDF workers must run this interpreter, with this environment's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in build_conf(settings, driver, log4j, jvm_options).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        hint = ("could not fetch " + driver.value + " (no network?); " + HOW_TO_PROVIDE
                if driver.kind == "packages" else "check java (JAVA_HOME) and --spark-conf")
        raise _JvmDidNotStart(f"Spark did not start ({one_line(exc, limit=300)}); {hint}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    _check_driver(spark, driver)
    log.info("Spark %s started: master %s, JDBC driver %s", spark.version, settings.master, driver.value)
    return spark


def _check_driver(spark: SparkSession, driver: JdbcDriver) -> None:
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j has no public handle
    assert jvm is not None
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DRIVER_CLASS, False, loader)
    except Exception as exc:
        spark.stop()
        raise SparkUnavailable(
            f"PostgreSQL JDBC driver not loadable from {driver.value}; {HOW_TO_PROVIDE}") from exc


def stop() -> None:
    """Stop the session (tests, process exit); a later get_spark starts a new one."""
    global _spark
    with _lock:
        if _spark is not None:
            _spark.stop()
            _spark = None
            for hook in _stop_hooks:
                hook()
