"""The owner's verdict on a Spark job's input, through the ``reorg`` command
with a real ``reorg worker`` (framework.submit): ``reorg submit`` runs no JVM
of its own while an owner runs, a bad expression is still one ``error:``
line with exit 2 and every table as it was (DESIGN 11), and a worker starts
Spark only for a job type that needs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cli_support import assert_one_error_line, dump, ok, reorg, reorg_json
from support import Workers, execute, make_items, wait_until
from support.processes import REORG, clean_env

pytestmark = pytest.mark.spark

BAD_INPUT = 2
SPARK_TIMEOUT = 180
# Tables the running worker writes whatever is submitted (heartbeat, lease).
NODE_TABLES = ("nodes", "owner_lease")


def submit_without_java(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``reorg submit ARGS`` in an environment where no JVM can start: what it
    reports can only come from the owner's analysis."""
    assert REORG
    return subprocess.run([REORG, "--db", url, "submit", *args], capture_output=True,
                          text=True, timeout=SPARK_TIMEOUT, stdin=subprocess.DEVNULL,
                          env=clean_env(JAVA_HOME="/nonexistent-java", PATH=_path_without_java()))


def _path_without_java() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if not (Path(d) / "java").exists())


def java_children(pid: int) -> list[int]:
    """Process ids of the JVMs ``pid`` started (PySpark's gateway is its child)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and comm == "java":
            found.append(int(entry.name))
    return found


def owner_elected(url: str) -> bool:
    return any(n["is_owner"] for n in reorg_json(url, "nodes"))


def test_owner_rejects_a_bad_expression_and_the_submit_leaves_nothing(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 500)
    worker = workers.start_cli("w1")
    wait_until(lambda: owner_elected(url), 30, "w1 elected owner")
    before = dump(url, skip=NODE_TABLES)

    bad = submit_without_java(url, "backfill", "--table", "items", "--set", "c=upper(nope)")
    line = assert_one_error_line(bad, BAD_INPUT)
    assert "--set c=upper(nope) is not a Spark SQL expression over public.items" in line, (
        line + worker.log())
    assert bad.stdout == ""
    bad_copy = submit_without_java(url, "copy", "--table", "items", "--target", "items2",
                                   "--create-target", "--select", "id",
                                   "--select", "nosuch_fn(b) AS x")
    assert "--select 'nosuch_fn(b) AS x' is not a Spark SQL expression" in (
        assert_one_error_line(bad_copy, BAD_INPUT))
    failing = submit_without_java(url, "backfill", "--table", "items",
                                  "--set", "a=CAST(b AS int)")
    assert "fails on sample rows" in assert_one_error_line(failing, BAD_INPUT)
    assert dump(url, skip=NODE_TABLES) == before  # no job row, no event, no column

    good = submit_without_java(url, "backfill", "--table", "items", "--set", "c=upper(b)")
    job_id = int(ok(good).strip())
    assert good.stderr == ""
    waited = reorg(url, "wait", str(job_id), "--timeout", "120", timeout=SPARK_TIMEOUT)
    assert waited.returncode == 0, waited.stderr + worker.log()
    assert execute(url, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM upper(b)") == [(0,)]


@pytest.mark.matrix  # a worker's Spark start-up: speed, a JVM of its own
def test_a_worker_starts_spark_only_for_a_job_type_that_needs_it(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 2_000)
    worker = workers.start_cli("w1")
    wait_until(lambda: owner_elected(url), 30, "w1 elected owner")
    job_id = int(ok(reorg(url, "submit", "sql-update", "--table", "items",
                          "--set", "c=md5(b)")).strip())
    assert ok(reorg(url, "wait", str(job_id), "--timeout", "60"))
    assert java_children(worker.pid) == [], worker.log()

    job_id = int(ok(reorg(url, "submit", "backfill", "--table", "items", "--set", "c=upper(b)",
                          timeout=SPARK_TIMEOUT)).strip())
    assert ok(reorg(url, "wait", str(job_id), "--timeout", "120", timeout=SPARK_TIMEOUT))
    assert len(java_children(worker.pid)) == 1, worker.log()


@pytest.mark.matrix  # a worker's Spark start-up: speed, a JVM of its own
def test_a_worker_started_with_spark_warmup_warms_the_analysis_before_any_submit(
        migrated_db: str, workers: Workers) -> None:
    """``--spark-warmup``: Spark starts with the worker and runs a made-up
    analysis (a JDBC read, an expression, Arrow) while idle, so the first
    submit does not wait for the JVM's first run of those paths."""
    url = migrated_db
    make_items(url, 500)
    worker = workers.start_cli("w1", "--spark-warmup")
    wait_until(lambda: "Spark warmed up for a first analysis" in worker.log(), SPARK_TIMEOUT,
               "the warm-up's analysis")
    assert len(java_children(worker.pid)) == 1, worker.log()
    assert "did not warm up" not in worker.log()
    job_id = int(ok(submit_without_java(url, "backfill", "--table", "items",
                                        "--set", "c=upper(b)")).strip())
    assert ok(reorg(url, "wait", str(job_id), "--timeout", "120", timeout=SPARK_TIMEOUT))
    assert execute(url, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM upper(b)") == [(0,)]
