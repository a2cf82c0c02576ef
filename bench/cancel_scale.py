"""A cancel of a job of many small subtasks: how long until the table is restored.

    python -m bench.cancel_scale [--rows 500000] [--subtasks 100000] [--processes 2]
                                 [--slots 2] [--cancel-at PERCENT] [--cancel-by SECONDS]

On a throwaway durable local PostgreSQL (fsync and synchronous_commit on; or
``--db``), a table ``bench.items`` of ``--rows`` rows whose column ``c`` holds
old values (one row in ten NULL, so the rollback restores both kinds of
before-image: a kept value, and NULL found by the batch's range) gets
``reorg submit sql-update --set c=md5(b) --rows-per-subtask ROWS/SUBTASKS``:
an overwrite, so every batch keeps the old values and a cancel must put them
back. ``--processes`` ``reorg worker --slots N`` processes run it until
``--cancel-at`` percent of its subtasks succeeded, or ``--cancel-by`` seconds
after it started running if that comes first (the report says which); then
``reorg cancel JOB`` as a command.

Reports, from the job's events (the database's clock) where it can:

- cancel -> cancelled: from the cancel's event to the job's ``cancelled``
  (and as the benchmark saw it: launching ``reorg cancel`` until status shows
  ``cancelled``); within it, cancel -> reverting (the forward subtasks'
  leases end), -> the revert step planned, -> cancelled;
- the forward subtasks done at the cancel, those the revert restores (every
  one with a checkpoint past its start), their rows, and the revert ranges
  planned for them (``framework.store.steps.revert_ranges``);
- the owner's longest transaction during the cancel (``pg_stat_activity``);
- cancelled -> every subtask of the job moved to history;
- restored exactly: a checksum of every row (all columns, in key order)
  before the submit against the same after the cancel, and the rows that
  differ from a copy taken before.

Prints one JSON document, then a one-line summary; exits 1 unless the job
ended ``cancelled`` with the table restored exactly.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.bigtable.measure import OwnerTransactions, wait_for
from bench.dataplane.errors import BenchError
from bench.dataplane.records import TABLE
from bench.dataplane.reorg_cli import REPO, clean_env, reorg
from bench.dataplane.server import database, execute, query_one, tool_parser
from bench.dataplane.tracking import job_status, subtasks, system_tables
from framework import control, migrate
from framework.db import Database
from framework.records import STEP_REVERT

COPY = f"{TABLE}_before"  # the table as it was before the job, row for row
POLL_SECONDS = 0.05
# Every column of every row, in key order: equal before and after only if
# each row came back as it was (no row lost or added either).
CHECKSUM_SQL = f"SELECT count(*), md5(string_agg(t::text, E'\\n' ORDER BY t.id)) FROM {TABLE} t"


def log(message: str) -> None:
    """Progress on stderr: stdout is the JSON document and the summary."""
    print(message, file=sys.stderr, flush=True)


def build_table(url: str, rows: int) -> None:
    """``bench.items`` with an old value in c (NULL in one row of ten), and
    its copy ``bench.items_before`` to name the rows that differ afterwards."""
    execute(url,
            "CREATE SCHEMA IF NOT EXISTS bench",
            f"DROP TABLE IF EXISTS {TABLE}, {COPY}",
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, a int, b text, c text)",
            f"INSERT INTO {TABLE} SELECT g, g % 1000, 'item ' || g, "
            f"CASE WHEN g % 10 = 0 THEN NULL ELSE 'old ' || md5(g::text) END "
            f"FROM generate_series(1, {int(rows)}) g",
            f"CREATE TABLE {COPY} AS TABLE {TABLE}",
            f"VACUUM (ANALYZE) {TABLE}")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        execute(url, "CHECKPOINT")  # the load's writes are not the job's to pay for


def differing_rows(url: str) -> int:
    """Rows of the table not as in its copy, either way (changed, lost, added)."""
    return int(query_one(url, f"SELECT count(*) FROM {TABLE} a FULL JOIN {COPY} b USING (id) "
                              "WHERE a IS DISTINCT FROM b")[0])


@contextlib.contextmanager
def workers(url: str, db: Database, processes: int, slots: int, log_dir: Path,
            name: str = "cancel") -> Iterator[list[subprocess.Popen[bytes]]]:
    """``processes`` ``reorg worker --slots SLOTS`` processes, as the command
    runs them, until each is registered and one of them is the owner;
    stopped (SIGTERM, then drained) at the end. Their node ids and logs are
    ``NAME-0``, ``NAME-1``..."""
    procs = []
    try:
        for i in range(processes):
            with open(log_dir / f"{name}-{i}.log", "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "cli.main", "worker", "--slots", str(slots),
                     "--node-id", f"{name}-{i}"],
                    cwd=REPO, env=clean_env(REORG_DATABASE_URL=url), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT))

        def ready() -> bool:
            if any(p.poll() is not None for p in procs):
                raise BenchError(f"a worker exited; see {log_dir}")
            nodes = control.nodes(db)
            return (sum(n["node_id"].startswith(f"{name}-") for n in nodes) == processes
                    and any(n["is_owner"] for n in nodes))

        wait_for("the workers registered, one of them the owner", ready, 120)
        log(f"{processes} workers registered, one of them the owner")
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


def state_is(db: Database, job_id: int, wanted: set[str], bad: set[str]) -> Callable[[], bool]:
    def check() -> bool:
        job = job_status(db, job_id)
        if job["state"] in bad:
            raise BenchError(f"job {job_id} is {job['state']}: {job['error']}")
        return bool(job["state"] in wanted)
    return check


def planned_subtasks(db: Database, job_id: int) -> int:
    """The subtasks the owner split the job into, as its start event names
    them (a big split goes into the table a chunk a tick, so the live count
    grows for a while)."""
    started = next(e for e in control.events(db, job_id) if e["to_state"] == "running")
    found = re.match(r"(\d+) subtasks", str(started["detail"]))
    if found is None:
        raise BenchError(f"job {job_id}'s start names no subtask count: {started['detail']}")
    return int(found.group(1))


def run_until_cancel_point(db: Database, job_id: int, total: int, percent: float,
                           by_seconds: float) -> tuple[dict[str, Any], str]:
    """Poll the job until ``percent`` of its ``total`` subtasks succeeded, or
    ``by_seconds`` after it started running; its status then and why."""
    deadline = time.monotonic() + by_seconds
    while True:
        job = job_status(db, job_id)
        if job["state"] != "running":
            raise BenchError(f"job {job_id} is {job['state']} before the cancel "
                             f"({job['succeeded']} subtasks done): raise --subtasks or "
                             f"lower --cancel-at")
        if job["succeeded"] >= percent / 100 * total:
            return job, "percent"
        if time.monotonic() > deadline:
            return job, "timeout"
        time.sleep(0.2)


def seconds_between(events: list[dict[str, Any]], start: dt.datetime,
                    match: Callable[[dict[str, Any]], bool]) -> float | None:
    """Seconds from ``start`` to the first event after it that ``match``es."""
    found = next((e for e in events if e["at"] >= start and match(e)), None)
    return round((found["at"] - start).total_seconds(), 2) if found else None


@dataclass
class Cancelled:
    """A job cancelled part way, as the benchmark saw it."""

    job_id: int
    subtasks: int  # the split's
    reason: str  # "percent" or "timeout": what set the cancel off
    done_at_cancel: int  # forward subtasks succeeded when `reorg cancel` was launched
    command_seconds: float  # the `reorg cancel` command alone
    seen_seconds: float  # launching it -> status shows the job cancelled
    owner_longest: float  # the owner's longest transaction meanwhile
    history_seconds: float  # seen cancelled -> every subtask in history


def run_and_cancel(url: str, db: Database, args: Any, rows_per_subtask: int) -> Cancelled:
    """Submit the overwrite, let the workers run it to the cancel point,
    ``reorg cancel`` it and wait until it is cancelled and moved to history."""
    submitted = reorg(url, "submit", "sql-update", "--table", TABLE, "--set", "c=md5(b)",
                      "--rows-per-subtask", str(rows_per_subtask), "--json")
    job_id = int(json.loads(submitted.stdout)["id"])
    log(f"submitted job {job_id}")
    wait_for(f"job {job_id} running", state_is(db, job_id, {"running"},
             {"failed", "cancelled", "reverting", "succeeded"}), 600)
    total = planned_subtasks(db, job_id)
    log(f"job {job_id} running: {total:,} subtasks of {rows_per_subtask} rows")
    at_cancel, reason = run_until_cancel_point(db, job_id, total, args.cancel_at, args.cancel_by)
    log(f"cancel ({reason}): {at_cancel['succeeded']:,} of {total:,} subtasks done")
    with OwnerTransactions(url) as owner:
        launched = time.perf_counter()
        done = reorg(url, "cancel", str(job_id), check=False)
        command_seconds = time.perf_counter() - launched
        if done.returncode != 0:
            raise BenchError(f"`reorg cancel {job_id}` exited {done.returncode}: "
                             f"{done.stderr.strip()} (a job this short ends before "
                             f"its cancel: raise --subtasks or lower --cancel-at)")
        wait_for(f"job {job_id} cancelled",
                 state_is(db, job_id, {"cancelled"}, {"failed", "succeeded", "reverted"}),
                 args.timeout)
        seen_seconds = time.perf_counter() - launched
    log(f"cancelled after {seen_seconds:.2f} s")
    moved = time.perf_counter()
    wait_for("every subtask moved to history",
             lambda: bool(job_status(db, job_id)["history_done"]), args.timeout)
    return Cancelled(job_id, total, reason, int(at_cancel["succeeded"]), command_seconds,
                     seen_seconds, owner.longest, time.perf_counter() - moved)


def measure(url: str, args: Any, log_dir: Path) -> dict[str, Any]:
    rows_per_subtask = max(args.rows // args.subtasks, 1)
    log(f"building {TABLE} with {args.rows:,} rows of old values")
    build_table(url, args.rows)
    before = query_one(url, CHECKSUM_SQL)
    with system_tables(url) as db:
        migrate.upgrade(db)  # as `reorg db upgrade` does, without a process of its own
        with workers(url, db, args.processes, args.slots, log_dir):
            run = run_and_cancel(url, db, args, rows_per_subtask)
        # The table as the cancel left it: nothing runs on it any more.
        restored = query_one(url, CHECKSUM_SQL) == before
        events = control.events(db, run.job_id)
        every = subtasks(db, run.job_id)
    cancel_at = next(e["at"] for e in events if e["detail"] == "cancel requested")
    progressed = [s for s in every if s["step"] != STEP_REVERT and s["curr_key"] > s["start_key"]]
    return {
        "rows": args.rows, "subtasks": run.subtasks, "rows_per_subtask": rows_per_subtask,
        "processes": args.processes, "slots": args.slots,
        "server": "--db" if args.db else ("throwaway local cluster, durability off" if args.fast_server
                                              else "throwaway local cluster, durable"),
        "cancel_when": (f"{args.cancel_at:g} % of subtasks done" if run.reason == "percent"
                        else f"{args.cancel_by:g} s after running, before {args.cancel_at:g} %"),
        "done_at_cancel": run.done_at_cancel,
        # Every forward range with a checkpoint past its start, once the cancel
        # took effect (those done while `reorg cancel` started too).
        "forward_ranges_to_restore": len(progressed),
        "rows_to_restore": sum(int(s["row_count"]) for s in progressed),
        "revert_ranges": sum(1 for s in every if s["step"] == STEP_REVERT),
        # The database's clock: from the cancel's event (its transaction's start).
        "seconds_cancel_to_cancelled": seconds_between(
            events, cancel_at, lambda e: e["to_state"] == "cancelled"),
        "seconds_cancel_to_reverting": seconds_between(
            events, cancel_at, lambda e: e["to_state"] == "reverting"),
        "seconds_cancel_to_revert_step": seconds_between(
            events, cancel_at, lambda e: e["to_state"] == "step revert"),
        "seconds_cancel_command": round(run.command_seconds, 2),
        "seconds_cancel_launched_to_seen_cancelled": round(run.seen_seconds, 2),
        "owner_longest_transaction_seconds": round(run.owner_longest, 2),
        "seconds_cancelled_to_history_moved": round(run.history_seconds, 2),
        "events": [f"{e['at'].time().isoformat(timespec='milliseconds')} {e['from_state']} -> "
                   f"{e['to_state']}: {e['detail']}" for e in events if e["at"] >= cancel_at],
        "restored_exactly": restored,
        "rows_differing": 0 if restored else differing_rows(url),
        "worker_logs": str(log_dir),
    }


def summary(r: dict[str, Any]) -> str:
    return (f"cancel of {r['subtasks']:,} subtasks on {r['rows']:,} rows, {r['done_at_cancel']:,} "
            f"done ({r['cancel_when']}): cancelled after {r['seconds_cancel_to_cancelled']} s "
            f"(revert step after {r['seconds_cancel_to_revert_step']} s, {r['revert_ranges']} "
            f"revert ranges for {r['forward_ranges_to_restore']:,} forward ranges, "
            f"{r['rows_to_restore']:,} rows); restored exactly: "
            f"{'yes' if r['restored_exactly'] else 'no'}")


def main() -> None:
    parser = tool_parser("bench.cancel_scale", __doc__, rows=500_000)
    parser.add_argument("--subtasks", type=int, default=100_000,
                        help="forward subtasks: --rows-per-subtask is ROWS / SUBTASKS")
    parser.add_argument("--processes", type=int, default=2, help="reorg worker processes")
    parser.add_argument("--slots", type=int, default=2, help="slots of each worker")
    parser.add_argument("--cancel-at", type=float, default=50.0, metavar="PERCENT",
                        help="cancel once this share of the subtasks succeeded")
    parser.add_argument("--cancel-by", type=float, default=300.0, metavar="SECONDS",
                        help="cancel this long after the job started running if --cancel-at "
                             "was not reached by then")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS",
                        help="give up waiting for the cancel (and the history moves) after this")
    args = parser.parse_args()
    if not 1 <= args.subtasks <= args.rows:
        parser.error(f"--subtasks must be between 1 and --rows ({args.rows}), got {args.subtasks}")
    if not 0 < args.cancel_at < 100:
        parser.error(f"--cancel-at is a percent between 0 and 100, got {args.cancel_at:g}")
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-cancel-logs-"))
    try:
        with database(args.db, durable=not args.fast_server) as server:
            report = measure(server.url, args, log_dir)
    except BenchError as exc:
        sys.exit(f"error: {exc} (worker logs in {log_dir})")
    print(json.dumps(report, indent=2))
    print(summary(report), flush=True)
    if not report["restored_exactly"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
