"""``backfill`` on a real Spark standalone cluster (support.hosts.SparkCluster:
master and a 1g worker from pyspark's ``spark-class``), its drivers the
``reorg worker`` processes on hosts of their own (``--spark-master spark://``,
``spark.driver.host`` = the host's address), while an application writer
changes rows. The Spark worker (the executor host), the master or PostgreSQL
(``pg_ctl -m immediate``, then restarted) is killed mid-batch; afterwards
every row holds the value computed from its latest write (no stale write
accepted) and the committed batch rows sum to the table (no batch applied
twice) (DESIGN 2, 3, 9)."""

from __future__ import annotations

import threading
import time

import pytest
from support import execute, make_items, scalar, wait_state
from support.oracle import report

from framework.submit import SubmitRequest, submit

pytestmark = [pytest.mark.fault, pytest.mark.spark]
ROWS = 20_000


class AppWriter:
    """The application: keeps changing ``b`` and writing ``c`` itself, as a
    deployed application does before a backfill of ``c``."""

    def __init__(self, db) -> None:
        self.db, self.writes = db, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                execute(self.db, "UPDATE items SET b = b || '+', c = md5(b || '+') "
                                 "WHERE id = (random() * :n)::int + 1", {"n": ROWS - 1})
                self.writes += 1
            except Exception:  # noqa: BLE001 - PostgreSQL may be away; the writer retries
                time.sleep(0.2)
            time.sleep(0.01)

    def __enter__(self) -> AppWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def check(db) -> dict[str, int]:
    stale = scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)")
    counted = scalar(db, "SELECT sum(row_count) FROM (SELECT row_count FROM {s}.background_subtask "
                         "UNION ALL SELECT row_count FROM {s}.background_subtask_history) x")
    assert stale == 0, f"{stale} rows hold a stale or missing value"
    assert counted == ROWS, f"committed batch rows {counted} != {ROWS}"
    return {"stale": stale, "counted": int(counted)}


def start_backfill(cluster, spark_cluster) -> int:
    make_items(cluster.db, ROWS)
    job_id = submit(cluster.db, SubmitRequest(
        "backfill", {"table": "items", "set": "c=md5(b)"},
        rows_per_subtask=2_500, batch_rows=500)).job_id
    for name in ("h1", "h2"):
        cluster.start(name, slots=1, spark=spark_cluster, faults="spark.before_apply=block")
    return job_id


# Matrix: a Spark cluster and two drivers take minutes to start on a loaded 2-core machine; the
# CI short form of "executor lost mid-batch" is test_spark_faults.py (the worker's JVM killed).
@pytest.mark.matrix
@pytest.mark.parametrize("victim", ["worker", "master", "postgres"])
def test_spark_node_killed_mid_batch(cluster, spark_cluster, victim):
    job_id = start_backfill(cluster, spark_cluster)
    gates = cluster.workers.gates
    with AppWriter(cluster.db) as app:
        # Both drivers have read and computed a batch on the cluster's executors.
        gates.wait_blocked("spark.before_apply", 180, count=2)
        if victim == "postgres":
            cluster.net.crash_postgres()  # pg_ctl -m immediate: executors' reads die too
        else:
            spark_cluster.kill(victim)
        killed = time.monotonic()
        gates.release("spark.before_apply")
        if victim == "postgres":
            cluster.net.start_postgres()
            cluster.db.engine.dispose()
        elif victim == "worker":
            # A lost host comes back (or another replaces it): the apps get executors again.
            spark_cluster.start_worker()
        state = wait_state(cluster.db, job_id, timeout=300)["state"]
        done = round(time.monotonic() - killed, 1)
    if victim == "master":
        spark_cluster.start_master()  # for the tests after this one
        spark_cluster.kill("worker")
        spark_cluster.start_worker()
    assert state == "succeeded", [w.log()[-2000:] for w in cluster.workers]
    figures = check(cluster.db)
    report(f"{victim} killed mid-batch", job="backfill", job_done_s=done,
           app_writes=app.writes, **figures)
