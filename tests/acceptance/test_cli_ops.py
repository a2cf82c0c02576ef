"""Running reorg in production, through the ``reorg`` command: exit codes,
the audit log's actor, --version, ``db current``/``db stop``, and a worker's
Prometheus metrics and JSON log lines."""

from __future__ import annotations

import getpass
import json
import platform
import signal
import socket
import urllib.error
import urllib.request
from importlib.metadata import version

from cli_support import assert_one_error_line, ok, reorg, reorg_json, submit
from prometheus_client.parser import text_string_to_metric_families
from support import execute, make_items, wait_until
from support.processes import Workers

from framework.localpg.cluster import free_port
from framework.revisions import head_revision

UNREACHABLE = "postgresql://x@127.0.0.1:1/x"
# The documented exit codes (README, "Exit codes").
OK, JOB_DID_NOT_SUCCEED, BAD_INPUT, TIMEOUT, OPERATIONAL = 0, 1, 2, 3, 5
ACTOR = f"{getpass.getuser()}@{socket.gethostname()}"


def test_wait_exit_codes_and_every_user_event_names_user_at_host(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 3_000)
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--rows-per-subtask", "1000")
    # No worker yet: the job stays queued.
    assert "has not finished" in assert_one_error_line(
        reorg(url, "wait", str(job), "--timeout", "0.3"), TIMEOUT)
    assert_one_error_line(reorg(UNREACHABLE, "wait", str(job)), OPERATIONAL)

    assert "batch_rows=400" in ok(reorg(url, "alter", str(job), "--batch-rows", "400"))
    events = reorg_json(url, "events", str(job))
    assert [(e["actor"], e["from_state"], e["to_state"], e["detail"]) for e in events] == [
        (ACTOR, None, "queued", "submitted"),
        (ACTOR, "queued", "queued", "altered: batch_rows=400"),
    ]

    workers.start_cli("w1", "--no-spark-warmup")
    waited = reorg(url, "wait", str(job), "--timeout", "60")
    assert waited.returncode == OK, waited.stderr
    assert f"job {job} succeeded" in waited.stdout

    other = submit(url, "--table", "items", "--set", "d=md5(b)", "--add-column", "d:text",
                   "--batch-rows", "100", "--concurrency", "1", "--max-rows-per-sec", "300")
    assert ok(reorg(url, "cancel", str(other))).strip() in ("cancelling", "reverting")
    line = assert_one_error_line(reorg(url, "wait", str(other), "--timeout", "60"),
                                 JOB_DID_NOT_SUCCEED)
    assert f"job {other} cancelled" in line
    cancel = [e for e in reorg_json(url, "events", str(other)) if e["to_state"] == "cancelling"]
    assert [e["actor"] for e in cancel] == [ACTOR]


def test_version_db_current_and_db_stop(migrated_db: str, fresh_db: str) -> None:
    assert ok(reorg(UNREACHABLE, "--version")).strip() == f"reorg {version('reorg')}"

    head = head_revision()
    assert ok(reorg(migrated_db, "db", "current")).strip() == (
        f"schema reorg at revision {head} (head)")
    assert reorg_json(migrated_db, "db", "current") == {
        "schema": "reorg", "revision": head, "head": head, "is_head": True}
    # Not at the head: exit 5 (test_cli_waits), the JSON still printed.
    not_installed = reorg(fresh_db, "db", "current", "--json")
    assert not_installed.returncode == OPERATIONAL, not_installed.stderr
    assert json.loads(not_installed.stdout) == {
        "schema": "reorg", "revision": None, "head": head, "is_head": False}
    assert "run `reorg db upgrade`" in assert_one_error_line(reorg(fresh_db, "db", "current"),
                                                             OPERATIONAL)
    # Reading the revision changes nothing.
    assert execute(fresh_db, "SELECT 1 FROM pg_namespace WHERE nspname = 'reorg'") == []
    assert_one_error_line(reorg(UNREACHABLE, "db", "current"), OPERATIONAL)

    line = assert_one_error_line(reorg(migrated_db, "db", "stop"), BAD_INPUT)
    assert "embedded" in line


def _scrape(port: int) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_worker_metrics_and_json_log_lines(migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 3_000)
    port = free_port()
    worker = workers.start_cli("w1", "--no-spark-warmup", "--metrics-port", str(port),
                               "--metrics-host", "127.0.0.1", "--progress-seconds", "0.2",
                               "--log-format", "json")
    health = wait_until(lambda: _health(port).get("status") == "ok" and _health(port), 30,
                        "the worker healthy")
    assert health["node"] == "w1" and health["state"] == "active", health
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--rows-per-subtask", "1000",
                 "--batch-rows", "500")
    waited = reorg(url, "wait", str(job), "--timeout", "60")
    assert waited.returncode == OK, waited.stderr + worker.log()

    j = str(job)
    # The owner sets the job's gauges on its next tick.
    m = wait_until(lambda: (m := _scrape(port)).get(
        ("reorg_job_progress_ratio", frozenset({("job_id", j)}))) == 1.0 and m,
        10, "job gauges at their final values")
    kind = ("job_type", "sql-update")
    assert m[("reorg_rows_processed_total", frozenset({("job_id", j), kind}))] == 3_000
    assert m[("reorg_job_rows_done", frozenset({("job_id", j)}))] == 3_000
    committed = m[("reorg_batches_total",
                   frozenset({("job_id", j), kind, ("outcome", "committed")}))]
    assert committed >= 6  # 3 ranges of 1,000 rows, 500 a batch (more if ranges were split)
    assert ("reorg_batches_total", frozenset({("job_id", j), kind, ("outcome", "rolled_back")})
            ) not in m
    assert m[("reorg_batch_duration_seconds_count", frozenset({kind}))] == committed
    assert m[("reorg_subtasks_total", frozenset({kind, ("outcome", "succeeded")}))] >= 3
    assert m[("reorg_subtasks_running", frozenset())] == 0
    assert m[("reorg_is_owner", frozenset())] == 1
    assert m[("reorg_job_state", frozenset({("job_id", j), ("state", "succeeded")}))] == 1
    assert m[("reorg_job_failed", frozenset({("job_id", j)}))] == 0
    info = [dict(k[1]) for k in m if k[0] == "reorg_build_info"]
    assert info == [{"version": version("reorg"), "python": platform.python_version()}]
    # Every reason is exported from the start (so an alert has a series), none counted.
    lost = {dict(k[1])["reason"]: v for k, v in m.items() if k[0] == "reorg_leases_lost_total"}
    assert lost == {"renewal_refused": 0, "untrusted": 0, "checkpoint_refused": 0}

    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=60) == 0
    lines = worker.log().splitlines()
    assert lines
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    for entry in entries:
        assert {"timestamp", "level", "logger", "message", "node"} <= entry.keys(), entry
        assert entry["node"] == "w1"
    done = [e for e in entries if e.get("subtask_id") and e.get("outcome") == "succeeded"]
    assert done and all(e["job_id"] == job and e["level"] == "INFO" for e in done)
    assert sum(e["rows"] for e in done) == 3_000
    assert sum(e["batches"] for e in done) == committed
    assert all(e["seconds"] >= 0 for e in done)
    assert any(e["message"] == f"metrics at http://127.0.0.1:{port}/metrics, health at /healthz"
               for e in entries)
    # The owner's progress line of the running job, its figures as fields.
    progress = [e for e in entries if e["logger"] == "reorg.progress"]
    assert progress, "a progress line"
    assert all(e["job_id"] == job and e["state"] == "running" and e["rows_total"] == 3_000
               and e["message"].startswith(f"job {job} sql-update public.items running: rows ")
               for e in progress), progress


def _health(port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:  # 503: the body says why
        return json.loads(error.read())
    except OSError:
        return {}


def test_the_metrics_address_is_checked_at_start(migrated_db: str) -> None:
    line = assert_one_error_line(
        reorg(migrated_db, "worker", "--metrics-port", str(free_port()),
              "--metrics-host", "nosuch.invalid"), BAD_INPUT)
    assert "cannot listen on nosuch.invalid:" in line and "--metrics-host" in line, line
