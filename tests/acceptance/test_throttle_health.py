"""Health throttles through the ``reorg`` command with a real worker process:
``--max-replica-lag`` against a real streaming standby (``pg_basebackup`` of
the test's own primary, replay paused and resumed on it), and
``--max-active-sessions`` against sessions the test keeps busy. Each holds
the job's batches while it is exceeded (the table stops changing), says so in
``reorg status``, is changed live by ``reorg alter``, and lets the job go on
once the database is healthy again."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest
from cli_support import job_status, ok, reorg, reorg_json, submit
from prometheus_client.parser import text_string_to_metric_families
from support import Workers, busy_sessions, execute, make_items, wait_until
from support.standby import Standby, primary_with_standby

from framework.localpg.cluster import free_port

# After the throttled note appears, a batch that passed the health gate just
# before may still commit (a slot re-reads health once a second): this long
# later, nothing may move any more.
SETTLE_SECONDS = 1.2
# How long the table must stay still to count as held (a fixed wait is the
# only way to see that something does not happen).
HELD_SECONDS = 1.5


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def filled(url: str) -> int:
    return execute(url, "SELECT count(c) FROM items")[0][0]


def throttled(url: str, job: int) -> str | None:
    return job_status(url, job)["throttled"]


def assert_held(url: str, job: int, reason: str) -> None:
    """The job is throttled for ``reason`` (a regex) and writes no row."""
    note = wait_until(lambda: throttled(url, job), 30, f"job {job} throttled")
    assert re.fullmatch(reason, note), note
    time.sleep(SETTLE_SECONDS)
    before = filled(url)
    time.sleep(HELD_SECONDS)
    assert filled(url) == before, "a batch ran while the job was throttled"
    assert job_status(url, job)["state"] == "running"
    text = ok(reorg(url, "status", str(job)))
    assert f"job {job} throttled: " in text, text


def wait_moving(url: str, job: int) -> None:
    """The job writes rows again and says it is not throttled."""
    start = filled(url)
    wait_until(lambda: filled(url) > start, 30, f"job {job} writing rows again")
    wait_until(lambda: not throttled(url, job), 30, f"job {job}'s throttled note gone")


def replay_lag(standby: Standby) -> float:
    """Seconds since the last transaction the standby replayed committed on
    the primary (the primary commits all the time: the worker's heartbeats)."""
    return execute(standby.url(), "SELECT coalesce(extract(epoch FROM clock_timestamp() "
                                  "- pg_last_xact_replay_timestamp()), 0)::float8")[0][0]


# About a minute each on a loaded 2-core host (most of it `reorg` commands
# starting and the job's paced batches): in the matrix, `pytest -m matrix`.
@pytest.mark.matrix
def test_replica_lag_holds_batches_while_a_real_standby_lags(scratch_dir: Path) -> None:
    with primary_with_standby(scratch_dir) as (primary, standby):
        primary.create_database("app")
        url = primary.url("app")
        ok(reorg(url, "db", "upgrade"))
        make_items(url, 40_000)
        pool = Workers(url)
        try:
            port = free_port()
            worker = pool.start_cli("w1", "--slots", "2", "--no-spark-warmup",
                                    "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
            job = submit(url, "--table", "items", "--set", "c=md5(b)",
                         "--rows-per-subtask", "2000", "--batch-rows", "200",
                         "--max-rows-per-sec", "400", "--max-replica-lag", "3600")
            wait_until(lambda: filled(url) > 0, 60, "the job writing rows")

            standby.pause_replay()  # it keeps receiving WAL but applies none: lag grows
            wait_until(lambda: replay_lag(standby) > 1.5, 30, "the standby lagging")
            wait_moving(url, job)  # within the job's limit of an hour
            # A tighter limit, live: the job holds.
            ok(reorg(url, "alter", str(job), "--max-replica-lag", "1"))
            assert_held(url, job, r"replica lag [\d.]+s > 1s \(.+\)")
            assert "replica lag 1s" in ok(reorg(url, "status", str(job)))  # the limit
            # The worker's metrics: the standby's lag, and why the job is held.
            scraped = wait_until(lambda: (m := scrape(port)).get(
                ("reorg_job_throttled", (("job_id", str(job)), ("reason", "replica_lag"))))
                and m, 30, "the owner's throttled gauge")
            lags = [v for (name, _), v in scraped.items() if name == "reorg_replica_lag_seconds"]
            assert len(lags) == 1 and lags[0] > 1, lags

            standby.resume_replay()
            wait_moving(url, job)
            ok(reorg(url, "alter", str(job), "--max-rows-per-sec", "0"))  # finish quickly
            waited = reorg(url, "wait", str(job), "--timeout", "90")
            assert waited.returncode == 0, waited.stderr + worker.log()
            assert execute(url, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)"
                           ) == [(0,)]
            altered = [e["detail"] for e in reorg_json(url, "events", str(job))
                       if e["detail"] and e["detail"].startswith("altered")]
            assert altered == ["altered: max_replica_lag=1", "altered: max_rows_per_sec=0"]
        finally:
            pool.stop_all()


@pytest.mark.matrix
def test_active_sessions_hold_batches_until_the_load_goes(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 40_000)
    worker = workers.start_cli("w1", "--slots", "2", "--no-spark-warmup")
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--rows-per-subtask", "2000",
                 "--batch-rows", "200", "--max-rows-per-sec", "400",
                 "--max-active-sessions", "2")
    wait_until(lambda: filled(url) > 0, 60, "the job writing rows")
    # reorg's own sessions (the worker's, this command's) never count.
    assert not throttled(url, job)

    with busy_sessions(url, 2) as pids:
        wait_until(lambda: execute(url, "SELECT count(*) FROM pg_stat_activity WHERE pid = "
                                        "ANY(%(p)s) AND state = 'active'", {"p": pids}
                                   ) == [(2,)], 10, "two busy sessions")
        wait_moving(url, job)  # 2 active sessions are within the limit of 2
        ok(reorg(url, "alter", str(job), "--max-active-sessions", "1"))  # live
        # (the test's own queries count too while they run)
        assert_held(url, job, r"active sessions \d+ > 1")
        assert "1 active sessions" in ok(reorg(url, "status", str(job)))  # the limit
    wait_moving(url, job)
    ok(reorg(url, "alter", str(job), "--max-rows-per-sec", "0"))  # finish quickly
    waited = reorg(url, "wait", str(job), "--timeout", "90")
    assert waited.returncode == 0, waited.stderr + worker.log()
    assert execute(url, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == [(0,)]
