"""Pure pieces of the Spark data plane, no SparkSession needed: driver
discovery, session settings, JDBC URLs, batch sizing, type rules, and that
importing the job type starts nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import types as T

from backfill.spark import compat
from backfill.spark.jdbc import JdbcUrlError, jdbc_target
from backfill.spark.session import (
    DRIVER_PACKAGE,
    JdbcDriver,
    SparkSettings,
    SparkUnavailable,
    build_conf,
    find_jdbc_driver,
    parse_conf_pairs,
    settings_environ,
    settings_from_env,
    validation_settings,
)
from backfill.spark.sizing import BatchSizer


def _jar(root: Path, version: str) -> Path:
    path = root / ".m2/repository/org/postgresql/postgresql" / version / f"postgresql-{version}.jar"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK")
    return path


def test_driver_discovery_order(tmp_path):
    system = tmp_path / "usr/share/java/postgresql.jar"
    home = tmp_path / "home"
    home.mkdir()
    # Nothing anywhere: Maven coordinates for Spark to resolve.
    assert find_jdbc_driver(None, home, system) == JdbcDriver("packages", DRIVER_PACKAGE)
    system.parent.mkdir(parents=True)
    system.write_bytes(b"PK")
    assert find_jdbc_driver(None, home, system) == JdbcDriver("jar", str(system))
    _jar(home, "42.6.0")
    newest = _jar(home, "42.10.1")  # numeric, not lexical, order
    assert find_jdbc_driver(None, home, system) == JdbcDriver("jar", str(newest))
    explicit = tmp_path / "mine.jar"
    explicit.write_bytes(b"PK")
    assert find_jdbc_driver(str(explicit), home, system) == JdbcDriver("jar", str(explicit))
    assert find_jdbc_driver("org.postgresql:postgresql:42.7.1", home, system).kind == "packages"
    with pytest.raises(SparkUnavailable, match="REORG_JDBC_JAR") as err:
        find_jdbc_driver(str(tmp_path / "missing.jar"), home, system)
    assert "\n" not in str(err.value)


def test_session_settings():
    env = {"REORG_SPARK_MASTER": "spark://m:7077",
           "REORG_SPARK_CONF": "spark.executor.memory=2g; spark.speculation=true"}
    settings = settings_from_env(env)
    assert settings.master == "spark://m:7077" and not settings.local
    conf = build_conf(settings, JdbcDriver("jar", "/x.jar"), "/tmp/l.properties")
    assert conf["spark.speculation"] == "false"  # never on for database sinks
    assert conf["spark.executor.memory"] == "2g" and conf["spark.jars"] == "/x.jar"
    assert "spark.driver.bindAddress" not in conf  # only local mode binds to loopback
    local = build_conf(SparkSettings(conf={"spark.driver.extraJavaOptions": "-Dx=1"}),
                       JdbcDriver("packages", DRIVER_PACKAGE), "/tmp/l.properties")
    assert local["spark.master"] == "local[*]" and local["spark.driver.host"] == "127.0.0.1"
    assert local["spark.jars.packages"] == DRIVER_PACKAGE
    assert "-Duser.timezone=UTC" in local["spark.driver.extraJavaOptions"]
    assert local["spark.driver.extraJavaOptions"].endswith("-Dx=1")  # added, not replaced
    with pytest.raises(SparkUnavailable, match="KEY=VALUE"):
        parse_conf_pairs(["memory"])


def test_submit_validates_on_a_local_session_even_for_a_cluster():
    cluster = SparkSettings("spark://m:7077", {"spark.driver.extraClassPath": "/x"}, "/j.jar")
    checked = validation_settings(cluster)
    assert checked.local and checked.master == "local[*]"
    # The class path stays: it keys the class-data archive workers build.
    assert checked.conf == cluster.conf and checked.jdbc_jar == "/j.jar"
    local = SparkSettings("local[2]")
    assert validation_settings(local) is local


@pytest.mark.parametrize("process, short_lived", [("command", True), ("worker", False)])
def test_only_a_commands_dry_run_session_starts_without_the_optimising_jit(
        monkeypatch, process, short_lived):
    """``reorg submit``'s session lives for one dry run: no C2 (half the JVM's
    CPU). A worker configures Spark before its node starts; its session, even
    when a submit-time check starts it, runs batches for hours and keeps C2."""
    from backfill.spark import session

    launched: list[str] = []
    monkeypatch.setattr(session, "_spark", None)
    monkeypatch.setattr(session, "_settings", None)
    monkeypatch.setattr(session, "_short_lived", False)
    monkeypatch.setattr(session, "_launch", lambda settings, driver, options: launched.append(options))
    if process == "worker":
        session.configure(SparkSettings("local[2]"))
    session.get_validation_spark()
    assert len(launched) == 1
    assert (session.SHORT_LIVED_JVM in launched[0].split()) is short_lived, launched


def test_a_child_process_gets_the_same_spark_settings():
    """The class-data archive's training child must start Spark as its worker
    does (options included), or the archive would not fit the worker's JVM."""
    settings = SparkSettings("spark://m:7077", {"spark.driver.extraClassPath": "/a:/b",
                                                "spark.executor.memory": "2g"}, "/j.jar")
    assert settings_from_env(settings_environ(settings)) == settings
    assert settings_from_env(settings_environ(SparkSettings())) == SparkSettings()


def test_jdbc_urls():
    t = jdbc_target("postgresql://u:p%40ss@db.example:6543/app?sslmode=require&application_name=x")
    assert t.url == "jdbc:postgresql://db.example:6543/app"
    assert t.properties["user"] == "u" and t.properties["password"] == "p@ss"
    assert t.properties["sslmode"] == "require" and t.properties["ApplicationName"] == "x"
    assert jdbc_target("postgresql+psycopg://u@127.0.0.1/app").url == "jdbc:postgresql://127.0.0.1:5432/app"
    # Without one of the user's, Spark's reads are named as reorg's own sessions
    # (left out of --max-active-sessions).
    assert jdbc_target("postgresql://u@h/app").properties["ApplicationName"] == "reorg-spark"
    assert t.write_props()["reWriteBatchedInserts"] == "true"
    with pytest.raises(JdbcUrlError, match="unix socket"):
        jdbc_target("postgresql://u@/app?host=/var/run/postgresql")


def test_batch_sizer_steers_toward_the_target_within_bounds():
    """Batches never exceed batch_rows (a kill -9 redoes at most the batches in
    flight); slow ones shrink them, fast ones grow them back."""
    sizer = BatchSizer(10_000, target_seconds=1.0)
    assert sizer.next_rows() == 10_000
    sizer.observe(10_000, 0.1)  # far too fast: still capped at batch_rows
    assert sizer.next_rows() == 10_000
    sizer.observe(10_000, 4.0)  # a slow batch: shrink, at most by half
    assert sizer.next_rows() == 5_000
    sizer.observe(5_000, 2.0)
    assert sizer.next_rows() == 2_500
    for _ in range(10):
        sizer.observe(sizer.rows, sizer.rows / 100)  # very slow: down to the lower bound
    assert sizer.next_rows() == 10_000 // 8
    sizer.observe(1_250, 1.25 / 6)  # fast again: grow, at most x3 per batch
    assert sizer.next_rows() == 3_750
    for _ in range(5):
        sizer.observe(sizer.rows, sizer.rows / 10_000_000)
    assert sizer.next_rows() == 10_000  # upper bound
    assert sizer.next_rows(rate_limit_per_subtask=500) == 500  # one target period of the limit
    sizer.retarget(2_000)  # `reorg alter --batch-rows`
    assert sizer.next_rows() == 2_000


def test_type_rules():
    assert compat.can_land(T.IntegerType(), T.LongType())
    assert not compat.can_land(T.LongType(), T.IntegerType())
    assert compat.can_land(T.LongType(), T.StringType())
    assert not compat.can_land(T.StringType(), T.IntegerType())
    assert compat.can_land(T.DecimalType(10, 2), T.DecimalType(12, 2))
    assert not compat.can_land(T.DecimalType(10, 2), T.DecimalType(10, 0))
    assert compat.can_land(T.DateType(), T.TimestampType())
    assert not compat.landable(T.ArrayType(T.IntegerType()))


def test_importing_the_job_type_starts_no_spark():
    code = ("import sys, backfill.spark_backfill.job as b; b.register(); "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[2])
