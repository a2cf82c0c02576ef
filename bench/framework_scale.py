"""The framework's own overheads at scale, with a job type that does nothing.

    python -m bench.framework_scale [--subtasks 100000] [--processes 4] [--slots 4]

One job of ``--subtasks`` no-op subtasks (a table of 5 rows per subtask, split
at ``--rows-per-subtask 5``) runs on ``--processes`` worker processes of
``--slots`` slots each, on a throwaway local PostgreSQL. Reports, from the
database's own timestamps where it can:

- split: submit to the job running (the owner's split and subtask insert);
- subtasks/s: claimed + checkpointed + finished per second, job start to end;
- status latency while the job runs: ``control.status`` in-process and
  ``reorg status JOB --json`` as a command (p50 / max), and beside each
  command its floor: a Python process that only connects and runs
  ``SELECT 1``, at the same moment (what the busy slots leave any command);
- owner tick: the job's start tick (its split planned, the first chunk of
  ranges inserted), then p50 / p95 / max while the job runs and while its
  subtasks move to history, and what the slowest running ticks did; how long
  after the job's end its last subtask reached history;
- pickup latency: idle workers, one small job submitted at a time, submit to
  its first subtask running (p50 / max);
- the floor: ``pgbench`` on the same server just before the job, 16 clients
  doing one-row ``UPDATE ... RETURNING`` transactions for ``--pgbench-seconds``
  (what PostgreSQL alone commits on this machine under its current load).

A subtask of the no-op type commits one checkpoint to its end key and
finishes: what a one-batch subtask costs the framework.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.dataplane.proctree import stat_fields
from bench.dataplane.server import add_fast_server, database
from framework import control, gc_tuning, jobtype, migrate
from framework.config import Settings
from framework.db import Database, sqlalchemy_url
from framework.jobtype import JobType
from framework.records import Job, Target
from framework.store import history, jobs
from framework.subtask import Batch, SubtaskContext

ROOT = Path(__file__).resolve().parents[1]
# ``reorg`` as a user's environment runs it: the script beside this Python
# (not a version manager's shim, a shell script in front of it).
REORG = str(Path(sys.executable).with_name("reorg")) if Path(sys.executable).with_name(
    "reorg").exists() else (shutil.which("reorg") or "reorg")
FLOOR_COMMAND = "import sys, psycopg; psycopg.connect(sys.argv[1]).execute('SELECT 1').fetchall()"

NOOP = "bench-noop"


class NoopJobType(JobType):
    """Splits like any job; each subtask checkpoints to its end and is done."""

    name = NOOP

    def validate(self, conn: Any, params: dict[str, Any]) -> Target:
        return Target(params["table"], '"id"', params)

    def prepare(self, conn: Any, job: Job) -> None:
        return None

    def write_batch(self, ctx: SubtaskContext, conn: Any) -> Batch:
        return Batch(ctx.end_key, ctx.end_key - ctx.curr_key)

    def advance(self, conn: Any, job: Job) -> None:
        return None

    def plan_revert(self, conn: Any, job: Job) -> bool:
        return True  # every range that ran gets a no-op revert subtask

    def revert_subtask(self, ctx: SubtaskContext) -> None:
        self.run_subtask(ctx)

    def revert(self, conn: Any, job: Job) -> None:
        return None


# --- worker process ------------------------------------------------------------

def run_worker(url: str, node_id: str, slots: int, ticks_file: str) -> None:
    """One node with the no-op type; owner tick durations go to ``ticks_file``."""
    from cli import logs
    from framework.node import Node

    logs.configure(debug=False)  # a line per subtask, as `reorg worker` writes it
    jobtype.register(NoopJobType())
    settings = Settings(url, local_job_max_subtasks=4, poll_seconds=0.5)
    node = Node(settings, node_id=node_id, slots=slots)
    tick = node.owner.tick
    out = open(ticks_file, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
    statements = StatementTimes(node.owner_db.engine)

    def timed_tick():  # type: ignore[no-untyped-def]
        statements.reset()
        started = time.monotonic()
        result = tick()
        if result.is_owner:
            out.write(json.dumps({"t": time.time(), "seconds": time.monotonic() - started,
                                  "actions": result.actions,
                                  "statements": statements.reset()}) + "\n")
        return result

    node.owner.tick = timed_tick  # type: ignore[method-assign]
    node.start()
    gc_tuning.settle_after_start()  # as `reorg worker` does
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        node.drain(5)


class StatementTimes:
    """Seconds each owner statement took in the current tick, by the store
    function that sent it (where a tick's time goes), and the commits'."""

    def __init__(self, engine: Any) -> None:
        self._times: dict[str, float] = {}
        sa.event.listen(engine, "before_cursor_execute", self._before)
        sa.event.listen(engine, "after_cursor_execute", self._after)
        sa.event.listen(engine, "commit", self._before_commit)
        self._commit_started: float | None = None
        self._last = "?"  # the function whose statement ran last: its transaction commits

    def reset(self) -> dict[str, float]:
        if self._commit_started is not None:
            self._add(f"last commit, after {self._last}", time.monotonic() - self._commit_started)
            self._commit_started = None
        times, self._times = self._times, {}
        return {k: round(v, 4) for k, v in times.items()}

    def _add(self, label: str, seconds: float) -> None:
        self._times[label] = self._times.get(label, 0.0) + seconds

    def _before(self, conn: Any, *_: Any) -> None:
        self._close_commit()
        conn.info["bench_started"] = time.monotonic()

    def _after(self, conn: Any, *_: Any) -> None:
        started = conn.info.pop("bench_started", None)
        if started is not None:
            self._last = _caller()
            self._add(self._last, time.monotonic() - started)

    def _before_commit(self, conn: Any) -> None:
        # A commit's end has no event: it ends at the next statement or tick.
        self._close_commit()
        self._commit_started = time.monotonic()

    def _close_commit(self) -> None:
        if self._commit_started is not None:
            # Until the next statement: the commit and any Python in between.
            self._add(f"commit, after {self._last}", time.monotonic() - self._commit_started)
            self._commit_started = None


def _caller() -> str:
    """The framework function that sent the statement (the innermost frame in
    framework/store, else in framework/)."""
    import inspect

    frame = inspect.currentframe()
    fallback = "?"
    while frame is not None:
        path = frame.f_code.co_filename
        if "/framework/store/" in path:
            return f"{Path(path).stem}.{frame.f_code.co_name}"
        if "/framework/" in path and fallback == "?" and "/framework/db.py" not in path:
            fallback = f"{Path(path).stem}.{frame.f_code.co_name}"
        frame = frame.f_back
    return fallback


# --- the run -------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=100_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--pickups", type=int, default=20)
    parser.add_argument("--pgbench-seconds", type=int, default=10,
                        help="length of the pgbench floor run (0: skip)")
    parser.add_argument("--url", help="an empty database to use instead of a throwaway server")
    parser.add_argument("--worker", nargs=3, metavar=("URL", "NODE_ID", "TICKS_FILE"),
                        help=argparse.SUPPRESS)
    add_fast_server(parser)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker[0], args.worker[1], args.slots, args.worker[2])
        return
    with database(args.url, durable=not args.fast_server) as server:
        report = measure(server.url, args, server.postmaster)
    print(json.dumps(report, indent=2))


def measure(url: str, args: argparse.Namespace, postmaster: int | None) -> dict[str, Any]:
    jobtype.register(NoopJobType())
    db = Database(Settings(url))
    migrate.upgrade(db)
    rows = args.subtasks * 5
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE bench_items (id bigint PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO bench_items SELECT generate_series(1, :n)"), {"n": rows})
        conn.execute(sa.text("ANALYZE bench_items"))
    ticks = Path(tempfile.mkstemp(prefix="reorg-ticks-", suffix=".jsonl")[1])
    procs = [subprocess.Popen(
        [sys.executable, "-m", "bench.framework_scale", "--slots", str(args.slots), "--worker",
         url, f"w{i}", str(ticks)], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
        for i in range(args.processes)]
    try:
        floor = pgbench_floor(url, args.pgbench_seconds)
        time.sleep(3)  # the nodes register and elect an owner
        job_id = submit(db, rows_per_subtask=5)
        wait_for(db, job_id, {"running", "succeeded"}, 600)
        cpu_before = cpu_now([p.pid for p in procs], postmaster)
        in_process: list[float] = []
        as_command: list[float] = []
        floor_command: list[float] = []
        while control.status(db, job_id)[0]["state"] != "succeeded":
            started = time.monotonic()
            control.status(db, job_id)
            in_process.append(time.monotonic() - started)
            if len(as_command) < 10:
                started = time.monotonic()
                subprocess.run([REORG, "--db", url, "status", str(job_id), "--json"],
                               capture_output=True, check=True)
                as_command.append(time.monotonic() - started)
                # The least any status command does, at the same moment: start
                # Python, connect, one query (the CPU the busy slots leave it).
                started = time.monotonic()
                subprocess.run([sys.executable, "-c", FLOOR_COMMAND, url],
                               capture_output=True, check=True)
                floor_command.append(time.monotonic() - started)
            time.sleep(0.5)
        cpu_after = cpu_now([p.pid for p in procs], postmaster)
        job = timings(db, job_id)
        run_end = time.time()
        wait_until_moved(db, job_id)
        moved_seconds = time.time() - run_end
        pickups = [pickup(db, i) for i in range(args.pickups)]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    tick_rows = [json.loads(line) for line in ticks.read_text().splitlines()]
    ticks.unlink()
    # The job's start tick (its split planned, the first chunk inserted)
    # apart: it runs once, before any subtask is live.
    starting = [t for t in tick_rows if t["t"] <= run_end and _starts_a_job(t)]
    running = sorted((t for t in tick_rows if t["t"] <= run_end and not _starts_a_job(t)),
                     key=lambda t: t["seconds"])
    moving = [t["seconds"] for t in tick_rows if t["t"] > run_end]
    slowest = running[int(0.9 * len(running)):]
    return {
        "machine": f"{os.cpu_count()} cores",
        "subtasks": job["subtasks"], "processes": args.processes, "slots": args.slots,
        "split_seconds": round(job["split_seconds"], 2),
        "subtasks_per_second": round(job["subtasks"] / job["run_seconds"], 1),
        "pgbench_tps_16_clients": floor,
        "subtasks_per_pgbench_transaction": (
            round(job["subtasks"] / job["run_seconds"] / floor, 3) if floor else None),
        # CPU seconds per 1,000 subtasks while the job ran: the worker
        # processes' (Python) and the server's (every postgres process).
        "cpu_seconds_per_1000_subtasks": {
            k: round(1000 * (cpu_after[k] - cpu_before[k]) / max(job["subtasks"], 1), 3)
            for k in cpu_after},
        "status_ms_in_process": ms_summary(in_process),
        "status_ms_command": ms_summary(as_command),
        "status_floor_ms_command": ms_summary(floor_command),
        "owner_tick_ms_start": ms_summary([t["seconds"] for t in starting]),
        "owner_tick_ms_running": ms_summary([t["seconds"] for t in running]),
        "owner_tick_ms_after": ms_summary(moving),
        # From the job's end (as seen here) until its last subtask is in
        # history: what the owner's moves left for after the run.
        "history_moved_seconds_after_end": round(moved_seconds, 2),
        # Where the time of the slowest tenth of the running ticks went: mean
        # ms per tick of each owner statement (by the function sending it).
        "owner_tick_slowest_tenth_ms": statement_means(slowest),
        "owner_tick_running_mean_ms": statement_means(running),
        # The three slowest running ticks whole: what they did, where it went.
        "owner_tick_slowest": [
            {"ms": round(1000 * t["seconds"]), "actions": [a[:60] for a in t["actions"]][:3],
             "statements_ms": statement_means([t], top=4)}
            for t in slowest[-3:][::-1]],
        "pickup_ms": ms_summary(pickups),
    }


def _starts_a_job(tick: dict[str, Any]) -> bool:
    return any(" started with " in action for action in tick["actions"])


def statement_means(ticks: list[dict[str, Any]], top: int = 16) -> dict[str, float]:
    totals: dict[str, float] = {}
    for t in ticks:
        for label, seconds in t.get("statements", {}).items():
            totals[label] = totals.get(label, 0.0) + seconds
    means = {k: round(1000 * v / max(len(ticks), 1), 1) for k, v in totals.items()}
    return dict(sorted(means.items(), key=lambda kv: -kv[1])[:top])


def cpu_now(workers: list[int], postmaster: int | None) -> dict[str, float]:
    """CPU seconds used so far by the worker processes and by the server
    (the postmaster and its children, from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid: int) -> tuple[int, float]:
        fields = stat_fields(pid)
        if fields is None:
            return -1, 0.0
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick

    used = {"workers": sum(stat(pid)[1] for pid in workers)}
    if postmaster is not None:
        server = stat(postmaster)[1]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                parent, seconds = stat(int(entry.name))
                if parent == postmaster:
                    server += seconds
        used["postgres"] = server
    return used


PGBENCH_SCRIPT = """\\set id random(1, 100000)
UPDATE pgbench_floor SET v = v + 1 WHERE id = :id RETURNING v;
"""


def pgbench_floor(url: str, seconds: int) -> float | None:
    """Transactions per second PostgreSQL alone commits here now: 16 pgbench
    clients, one-row UPDATE ... RETURNING each; None when skipped or no pgbench."""
    if seconds <= 0 or shutil.which("pgbench") is None:
        return None
    engine = sa.create_engine(sqlalchemy_url(url))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE pgbench_floor (id int PRIMARY KEY, v int NOT NULL)"))
        conn.execute(sa.text("INSERT INTO pgbench_floor SELECT g, 0 FROM generate_series(1, 100000) g"))
        conn.execute(sa.text("ANALYZE pgbench_floor"))
    engine.dispose()
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(PGBENCH_SCRIPT)
        script.flush()
        out = subprocess.run(["pgbench", "-n", "-c", "16", "-j", "2", "-T", str(seconds),
                              "-f", script.name, url], capture_output=True, text=True, check=True)
    tps = re.search(r"tps = ([0-9.]+)", out.stdout)
    return round(float(tps.group(1)), 1) if tps else None


def ms_summary(seconds: list[float]) -> dict[str, float]:
    return {"n": len(seconds), "p50": round(1000 * percentile(seconds, 0.5), 1),
            "p95": round(1000 * percentile(seconds, 0.95), 1),
            "max": round(1000 * max(seconds, default=float("nan")), 1)}


def submit(db: Database, *, rows_per_subtask: int, table: str = '"public"."bench_items"') -> int:
    with db.begin() as conn:
        job_id, _ = jobs.insert(
            db, conn, type=NOOP, params={"table": table, "rows_per_subtask": rows_per_subtask},
            target_table=table, key_column='"id"', job_key=None, priority=0, concurrency=10_000,
            batch_rows=10_000, max_rows_per_sec=None, actor="bench")
    return job_id


def wait_for(db: Database, job_id: int, states: set[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while control.status(db, job_id)[0]["state"] not in states:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not reach {states}")
        time.sleep(0.05)


def timings(db: Database, job_id: int) -> dict[str, float]:
    job = control.status(db, job_id)[0]
    return {"split_seconds": (job["started_at"] - job["created_at"]).total_seconds(),
            "run_seconds": (job["finished_at"] - job["started_at"]).total_seconds(),
            "subtasks": job["succeeded"] + job["failed"] + job["cancelled"]}


def wait_until_moved(db: Database, job_id: int, timeout: float = 600) -> None:
    """Until the job's subtasks are all in history (the owner moves them)."""
    deadline = time.monotonic() + timeout
    while not control.status(db, job_id)[0]["history_done"]:
        if time.monotonic() > deadline:
            raise TimeoutError("subtasks were not moved to history")
        time.sleep(0.5)


def pickup(db: Database, i: int) -> float:
    """Submit a one-subtask job to idle workers; seconds to its first subtask running."""
    with db.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE IF NOT EXISTS pickup_{i} (id bigint PRIMARY KEY)"))
        conn.execute(sa.text(f"INSERT INTO pickup_{i} VALUES (1) ON CONFLICT DO NOTHING"))
    time.sleep(0.3)  # idle
    job_id = submit(db, rows_per_subtask=5, table=f'"public"."pickup_{i}"')
    wait_for(db, job_id, {"succeeded"}, 60)
    created = control.status(db, job_id)[0]["created_at"]
    with db.begin() as conn:
        first = min(st["started_at"] for st in history.subtasks_of_job(db, conn, job_id)
                    if st["started_at"] is not None)  # type: ignore[type-var]
    return float((first - created).total_seconds())


if __name__ == "__main__":
    main()
