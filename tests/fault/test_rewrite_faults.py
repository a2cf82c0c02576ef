"""``rewrite`` under faults, with real ``reorg worker`` processes and an
application writing the whole time (support.rewrite.KeyApp, which also
updates keys, deletes and re-inserts them): a worker killed (-9) in the
copy resumes its range from ``curr_key`` on another worker (in the matrix
also with ``--engine spark``, its column computed by Spark); an owner killed
(as kill -9) inside the swap's transaction leaves T as it was (the swap
happened or not) and its heir swaps once; in the matrix, a worker killed in
the build and in the catch-up. Each time T ends equal to the oracle with
nothing of the job left."""

from __future__ import annotations

import signal

import pytest
from support import held_by, job_of, rows, scalar, wait_state
from support.processes import TEST_JOB_TYPES
from support.rewrite import BIGINT, COMPOSITE, KeyApp, make_table, table_as_oracle

from backfill.rewrite.job import register
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault

ROWS = 3_000
JOB_TYPES = f"{TEST_JOB_TYPES},backfill.rewrite.job:register"


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register()


def _started_app(url: str, key) -> KeyApp:
    app = KeyApp(url, key, space=4 * ROWS)
    app.load()
    app.start()
    return app


def _rewrite(**params) -> SubmitRequest:
    return SubmitRequest("rewrite", {"table": "items", **params}, batch_rows=100,
                         rows_per_subtask=1_000)


def _leftovers(db) -> int:
    return scalar(db, r"""SELECT (SELECT count(*) FROM pg_class
                                  WHERE relname ~ '^(reorg_\d+_|rewrite_\d+_)')
                               + (SELECT count(*) FROM pg_trigger WHERE tgname ~ '^reorg_\d+_')""")


def _finished(db, settings, app: KeyApp, job_id: int, key) -> None:
    done = wait_state(db, job_id, timeout=180)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    assert table_as_oracle(settings.database_url, key[0]) == app.oracle
    assert _leftovers(db) == 0


# --engine spark: c computed by Spark in the copy and the replays, as the
# user's trigger computes it on every write (table_as_oracle checks c = length(b)).
ON_SPARK = {"sets": ["c=length(b)"], "engine": "spark"}


@pytest.mark.parametrize(("key", "params"), [
    (BIGINT, {}), pytest.param(COMPOSITE, {}, marks=pytest.mark.matrix),
    pytest.param(BIGINT, ON_SPARK, marks=[pytest.mark.spark, pytest.mark.matrix])],
    ids=["integer", "composite", "spark"])
def test_kill_9_of_a_worker_mid_copy_resumes_its_range_from_curr_key(db, settings, workers,
                                                                      gates, key, params):
    url = settings.database_url
    make_table(url, key, ROWS)
    app = _started_app(url, key)
    job_id = submit(db, _rewrite(**params)).job_id
    # Its third batch committed, the victim stops there: caught mid-range.
    victim = workers.start("victim", slots=1, faults="worker.after_batch=block@3",
                           REORG_JOB_TYPES=JOB_TYPES)
    gates.wait_blocked("worker.after_batch", timeout=90)
    (caught,) = held_by(db, "victim")
    assert job_of(db, job_id)["step"] == 1 and caught.curr_key != caught.start_key
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    workers.start("heir", slots=2, REORG_JOB_TYPES=JOB_TYPES)
    _finished(db, settings, app, job_id, key)
    # The heir finished the range the victim held. Had it copied the range
    # again from its start, not from curr_key, the victim's three batches
    # would be in the shadow twice, and its primary key's build (before the
    # swap) would have failed the job on the duplicates.
    (curr_key, end_key, attempts, exec_id), = rows(db, """
        SELECT curr_key, end_key, attempts, exec_id FROM {s}.background_subtask WHERE id = :i
        UNION ALL SELECT curr_key, end_key, attempts, exec_id
        FROM {s}.background_subtask_history WHERE id = :i""", i=caught.id)
    assert attempts == 2 and exec_id == "heir" and curr_key == end_key


@pytest.mark.matrix  # in CI: test_postgres_crash_and_restart[mid-swap], the same transaction lost
def test_an_owner_killed_inside_the_swap_leaves_t_as_it_was_and_its_heir_swaps(
        db, settings, workers):
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    table = scalar(db, "SELECT 'items'::regclass::oid")
    app = _started_app(url, BIGINT)
    job_id = submit(db, _rewrite(alter="ALTER COLUMN a TYPE bigint")).job_id
    victim = workers.start("victim", slots=2, faults="rewrite.in_swap=exit",
                           REORG_JOB_TYPES=JOB_TYPES)
    victim.proc.wait(120)
    assert victim.proc.returncode == 137
    job = job_of(db, job_id)
    assert job["state"] == "running" and job["step"] == 4, job
    # The swap's transaction died with the owner: T is T, still captured.
    assert scalar(db, "SELECT 'items'::regclass::oid") == table
    assert scalar(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'items'::regclass "
                      "AND tgname LIKE 'reorg_%capture'") == 1
    workers.start("heir", slots=2, REORG_JOB_TYPES=JOB_TYPES)
    _finished(db, settings, app, job_id, BIGINT)
    assert scalar(db, "SELECT 'items'::regclass::oid") != table
    assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                      "attrelid = 'items'::regclass AND attname = 'a'") == "bigint"


@pytest.mark.matrix
@pytest.mark.parametrize(("point", "step"), [
    ("rewrite.before_build=exit", 2), ("rewrite.before_replay=exit@3", 3),
    ("rewrite.in_analyze=exit", 4),  # the verify step's ANALYZE, its mark not committed
], ids=["build", "catch-up", "verify-analyze"])
def test_kill_9_of_a_worker_in_a_fixed_step_is_retried_by_another(db, settings, workers, point,
                                                                   step):
    url = settings.database_url
    make_table(url, COMPOSITE, ROWS)
    app = _started_app(url, COMPOSITE)
    job_id = submit(db, _rewrite()).job_id
    victim = workers.start("victim", slots=2, faults=point, REORG_JOB_TYPES=JOB_TYPES)
    victim.proc.wait(120)
    assert victim.proc.returncode == 137
    assert job_of(db, job_id)["step"] == step
    workers.start("heir", slots=2, REORG_JOB_TYPES=JOB_TYPES)
    _finished(db, settings, app, job_id, COMPOSITE)
    # The new table has its statistics: the heir took them again.
    assert scalar(db, "SELECT count(*) FROM pg_stats WHERE tablename = 'items'") > 0


# --- PostgreSQL crashed (pg_ctl -m immediate) and restarted -------------------------------
# The worker on a host of its own (support.host_fixtures), the application
# told to survive the crash (support.app_model: a write the crash cut is read
# back, so its oracle stays exact).


def _crash_and_restart(cluster) -> None:
    cluster.net.crash_postgres()
    cluster.net.start_postgres()
    cluster.db.engine.dispose()  # the test's pool holds connections of the dead server


def _crash_leftovers(db) -> list:
    return rows(db, r"""SELECT relname FROM pg_class WHERE relname ~ '^(reorg_\d+_|rewrite_\d+_)'
                        UNION ALL SELECT tgname FROM pg_trigger WHERE tgname ~ '^reorg_\d+_'""")


@pytest.mark.parametrize("point", [
    "rewrite.in_swap",  # inside the swap's transaction: T renamed away, the shadow is T
    pytest.param("worker.after_batch", marks=pytest.mark.matrix),  # mid-copy
], ids=["mid-swap", "mid-copy"])
def test_postgres_crash_and_restart(cluster, point):
    from support import make_items
    from support.app_model import Application, data

    db = cluster.db
    make_items(db, ROWS)
    table = scalar(db, "SELECT 'items'::regclass::oid")
    with Application(db.engine, survives_crashes=True) as app:
        job_id = submit(db, _rewrite()).job_id
        worker = cluster.start("a", faults=f"{point}=block", REORG_JOB_TYPES=JOB_TYPES)
        cluster.workers.gates.wait_blocked(point, 180)
        held = job_of(db, job_id)
        _crash_and_restart(cluster)
        # Recovered without the open transaction: the job where it was, T itself.
        after = job_of(db, job_id)
        assert (after["state"], after["step"]) == ("running", held["step"]), after
        assert scalar(db, "SELECT 'items'::regclass::oid") == table
        cluster.workers.gates.release(point)  # on, on a dead connection
        done = wait_state(db, job_id, timeout=180)
        app.wait_writes(20, timeout=60)
    assert done["state"] == "succeeded", job_of(db, job_id)
    assert not app.errors, app.errors
    assert scalar(db, "SELECT count(*) FROM {s}.job_events WHERE job_id = :j "
                      "AND to_state = 'succeeded'", j=job_id) == 1
    assert scalar(db, "SELECT 'items'::regclass::oid") != table
    assert data(db.engine) == app.expected()
    assert _crash_leftovers(db) == []
    assert worker.alive()
    worker.signal(signal.SIGTERM)
