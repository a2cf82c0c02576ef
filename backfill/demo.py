"""``reorg demo``: the whole product in one command, on the configured
database (the embedded default unless --db is given). A command of the job
types' package, not of cli/ (cli/ knows no job type): it joins ``reorg``
through the ``reorg.commands`` entry point. Not a job type, so, alone in
``backfill``, it uses cli/'s output and progress helpers (no worker ever
imports it; tests/unit/test_layout.py).

    create reorg_demo.items (N rows) ─► start W local `reorg worker`s
      ─► submit backfill c = md5(b) (PySpark range scans; --job-type sql-update
         runs it in PostgreSQL) ─► live progress ─► verify ─► stop workers
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import sqlalchemy as sa
import typer

from cli import progress
from cli.context import CliState, cli_state
from cli.errors import JOB_DID_NOT_SUCCEED, CliFailure
from cli.output import console, count
from cli.stderr import child_stderr_hidden
from framework import control
from framework.config import Settings
from framework.db import Database
from framework.durations import duration
from framework.store import jobs
from framework.submit import SubmitRequest, submit

app = typer.Typer()

DEMO_TABLE = "reorg_demo.items"
DEMO_TABLE_QUOTED = '"reorg_demo"."items"'
STOP_TIMEOUT = 60.0


class DemoJobType(StrEnum):
    # Both take "c=md5(b)": a PostgreSQL expression for one, Spark SQL for the other.
    SQL_UPDATE = "sql-update"
    BACKFILL = "backfill"


@app.command()
def demo(
    ctx: typer.Context,
    rows: Annotated[int, typer.Option(envvar="REORG_DEMO_ROWS", min=1,
                                      help="Rows in the sample table.")] = 1_000_000,
    workers: Annotated[int, typer.Option(envvar="REORG_DEMO_WORKERS", min=1,
                                         help="Local worker processes to start.")] = 2,
    job_type: Annotated[DemoJobType, typer.Option(
        "--job-type", envvar="REORG_DEMO_JOB_TYPE",
        help="backfill runs c = md5(b) as PySpark range scans (each worker starts Spark, "
             "a few seconds); sql-update runs the same in PostgreSQL.")] = DemoJobType.BACKFILL,
) -> None:
    """Fill a sample table, run a backfill on local workers, verify the result."""
    state = cli_state(ctx)
    db = state.database()
    logs = Path(tempfile.mkdtemp(prefix="reorg-demo-"))
    procs = start_workers(state, workers, logs)
    try:
        workers_alive = _check_alive(procs, logs)
        _retire_previous_job(db, workers_alive)
        console.print(f"creating {DEMO_TABLE} with {count(rows)} rows ...")
        create_sample_table(db, rows)
        with child_stderr_hidden(enabled=not state.options.debug):
            job_id = submit(db, SubmitRequest(
                type=str(job_type), params={"table": DEMO_TABLE, "set": "c=md5(b)"})).job_id
        assert job_id is not None
        _stop_validation_spark()
        console.print(f"submitted {job_type} job {job_id}: c = md5(b) on {DEMO_TABLE}, "
                      f"on {workers} worker(s)")
        started = time.monotonic()
        job = progress.watch(db, job_id, 1, on_tick=workers_alive)[0]
        took = time.monotonic() - started
        wrong = count_wrong_rows(db)
    finally:
        stop_workers(procs)
    if job["state"] != "succeeded" or wrong:
        raise CliFailure(f"demo failed: job {job_id} {job['state']}"
                         f"{': ' + job['error'] if job['error'] else ''}; {count(wrong)} rows "
                         f"differ from md5(b); worker logs in {logs}", JOB_DID_NOT_SUCCEED)
    shutil.rmtree(logs, ignore_errors=True)
    print(f"demo passed: job {job_id} set c = md5(b) on {count(rows)} rows in "
          f"{duration(took)} ({count(rows / max(took, 1e-9))} rows/s) with {workers} worker(s); "
          "0 rows differ")


def _stop_validation_spark() -> None:
    """Submitting a backfill started Spark in this process to check the
    expression; the workers do the work, so give its JVM's memory back."""
    session = sys.modules.get("backfill.spark.session")
    if session is not None:
        session.stop()


def _check_alive(procs: list[subprocess.Popen[bytes]], logs: Path) -> progress.Tick:
    """A tick that stops the demo when a worker died (it would wait forever)."""

    def check() -> None:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                raise CliFailure(f"demo failed: worker {i} exited with code {p.returncode}; "
                                 f"see {logs / f'worker-{i}.log'}")

    return check


def start_workers(state: CliState, n: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, **worker_environment(state.settings(), state.options.debug)}
    procs = []
    for i in range(n):
        with open(logs / f"worker-{i}.log", "wb") as log:
            # A fixed node id: a rerun releases whatever an interrupted demo held.
            # A session of their own: Ctrl-C reaches only the demo, which then
            # drains them with one SIGTERM each.
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "cli.main", "worker",
                 "--node-id", f"{socket.gethostname()}:demo-{i}"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
    return procs


def worker_environment(settings: Settings, debug: bool) -> dict[str, str]:
    """The global options as REORG_* variables, with the database resolved."""
    return {
        "REORG_DATABASE_URL": settings.database_url,
        "REORG_SCHEMA": settings.schema,
        "REORG_LEASE_SECONDS": str(settings.lease_seconds),
        "REORG_OWNER_LEASE_SECONDS": str(settings.owner_lease_seconds),
        "REORG_MAX_ATTEMPTS": str(settings.max_attempts),
        "REORG_DEBUG": "1" if debug else "0",
    }


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _retire_previous_job(db: Database, check_workers: progress.Tick) -> None:
    """An interrupted demo may have left its job active, which would refuse
    the new one: cancel it and let the workers roll it back."""
    with db.begin() as conn:
        previous = jobs.active_on_table(db, conn, DEMO_TABLE_QUOTED)
    if previous is None:
        return
    console.print(f"cancelling job {previous}, left over from an earlier demo ...")
    control.cancel(db, previous)
    progress.wait_ended(db, previous, None, on_tick=check_workers)


def create_sample_table(db: Database, rows: int) -> None:
    with db.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS reorg_demo"))
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {DEMO_TABLE}"))
        conn.execute(sa.text(
            f"CREATE TABLE {DEMO_TABLE} (id bigint PRIMARY KEY, a int, b text, c text)"))
        conn.execute(sa.text(
            f"INSERT INTO {DEMO_TABLE} SELECT g, g % 1000, 'item ' || g, NULL "
            "FROM generate_series(1, :n) g"), {"n": rows})
        # Fresh statistics keep the workers' range scans on the primary key.
        conn.execute(sa.text(f"ANALYZE {DEMO_TABLE}"))


def count_wrong_rows(db: Database) -> int:
    with db.begin() as conn:
        return int(conn.execute(sa.text(
            f"SELECT count(*) FROM {DEMO_TABLE} WHERE c IS DISTINCT FROM md5(b)")).scalar_one())
