"""Benchmark: reorg's backfill against a hand-written PySpark job and plain SQL.

    python bench/backfill.py [--rows 2000000] [--db URL] [--skip-reorg]
                             [--job-type backfill|sql-update|both] [--doc docs/benchmarks.md]

One run, one table ``bench.items (id bigint primary key, a int, b text, c text)``
of N rows, and the same change ``c = md5(b)`` made by each contender:

    (1) reorg         `reorg submit backfill --table bench.items --set c=md5(b)` on one
                      `reorg worker --slots 2`, timed from submit to `reorg wait` exit 0
    (2) plain Spark   bench/plain_spark.py: JDBC read (partitioned on id), md5 in Spark,
                      JDBC write to a staging table, one UPDATE ... FROM staging
    (3) chunked SQL   UPDATE in 10,000-key chunks from two autocommit connections
    (4) one UPDATE    UPDATE bench.items SET c = md5(b), for reference

Before every contender the table is put back into one physical state (see
``reset_table``), and after it every row is checked against md5(b). Then a
second reorg run is killed with SIGKILL at ~40 % and resumed by another
worker, to count the rows processed twice. Results go to stdout and to
docs/benchmarks.md (overwritten). Without --db, a throwaway durability-off
PostgreSQL cluster is started under /tmp and removed afterwards.

Beside it: ``plain_spark.py`` (contender 2, run as its own process),
``report.py`` (the parameters, result records, printed summary and
docs/benchmarks.md) and ``proctree.py`` (process trees, memory and CPU from /proc).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import psycopg
from proctree import Neighbours, RssSampler, process_tree
from report import (
    CHUNK_ROWS,
    KILL_AT,
    PROGRESS_SECONDS,
    SPARK_PARTITIONS,
    SQL_CONNECTIONS,
    TABLE,
    WORKER_SLOTS,
    Batches,
    InFlight,
    KillRun,
    PlainSpark,
    RangeRead,
    ReorgRun,
    Results,
    WorkerStartup,
    machine,
    summary_lines,
    write_doc,
)

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "bench"
DEFAULT_DOC = REPO / "docs" / "benchmarks.md"

SYSTEM_SCHEMA = "reorg"

# The worker, started as `reorg worker` is (cli.main.main), with two additions
# that only observe: the Spark engine's per-batch DEBUG line (read/merge
# seconds) and the time SparkSession start-up takes in this process. Plain
# --debug would also log every py4j message, which slows the worker down.
WORKER_BOOT = """\
import logging, time
logging.getLogger("reorg.spark.engine").setLevel(logging.DEBUG)
try:
    import backfill.spark.session as _session
except ImportError:
    _session = None
if _session is not None and hasattr(_session, "_start"):
    _start = _session._start
    def _timed_start(settings):
        began = time.perf_counter()
        spark = _start(settings)
        logging.getLogger("bench").info(
            "SparkSession started in %.2fs", time.perf_counter() - began)
        return spark
    _session._start = _timed_start
from cli.main import main
main()
"""
LOG_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
BATCH_RE = re.compile(r"subtask (\d+) batch \[(-?\d+), (-?\d+)\): (\d+) rows, read ([\d.]+)s, "
                      r"merge ([\d.]+)s, (\d+) rounds")
SPARK_START_RE = re.compile(r"SparkSession started in ([\d.]+)s")
SPARK_FAILED_RE = re.compile(r"Spark did not start.*")
SPARK_JOB_TYPES = {"backfill", "copy", "checksum"}
# A Spark JDBC range read of the target, as PostgreSQL logs it (log_statement = all).
# A cursor's later fetches log as "execute fetch from ...": not new reads.
# Log lines start with log_line_prefix '%m [%p] ' (PostgreSQL's default): the time first.
RANGE_READ_RE = re.compile(
    r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) [^\n]*?LOG:  execute (?!fetch from)[^\n]*?'
    r'FROM "bench"\."items"[^\n]*?reorg_src\s+WHERE[^\n]*?\("id" >= (-?\d+)\) AND \("id" < (-?\d+)\)',
    re.MULTILINE)


T = TypeVar("T")


class BenchError(RuntimeError):
    """A contender failed or produced a wrong table; the run stops."""


# --- timing ---------------------------------------------------------------------


@dataclass
class Lap:
    seconds: float = float("nan")


@contextlib.contextmanager
def timed(label: str) -> Iterator[Lap]:
    """``with timed("x") as lap:`` ... afterwards ``lap.seconds`` is the wall time."""
    lap = Lap()
    began = time.perf_counter()
    yield lap
    lap.seconds = time.perf_counter() - began
    print(f"    {label}: {lap.seconds:.2f} s", flush=True)


# --- database -------------------------------------------------------------------


@dataclass
class Server:
    url: str
    log_file: Path | None  # the server log, when we started the server ourselves
    postmaster: int | None  # its pid, likewise


@contextlib.contextmanager
def database(url: str | None) -> Iterator[Server]:
    if url:
        yield Server(url, None, None)
        return
    from framework.localpg.cluster import LocalPostgres

    data_dir = Path(tempfile.mkdtemp(prefix="reorg-bench-", dir="/tmp"))
    cluster = LocalPostgres(data_dir, durable=False)
    try:
        cluster.init()
        cluster.start()
        print(f"PostgreSQL (durability off) at {cluster.url()}, data in {data_dir}", flush=True)
        pid = int((cluster.pgdata / "postmaster.pid").read_text().split()[0])
        yield Server(cluster.url(), cluster.log_file, pid)
    finally:
        cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def execute(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def query_one(url: str, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return tuple(row)


def build_table(url: str, rows: int) -> None:
    execute(url,
            "CREATE SCHEMA IF NOT EXISTS bench",
            f"DROP TABLE IF EXISTS {TABLE}",
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, a int, b text, c text)",
            f"INSERT INTO {TABLE} SELECT g, g % 1000, 'item ' || g, NULL "
            f"FROM generate_series(1, {int(rows)}) g")


def reset_table(url: str) -> None:
    """Put the table into the state it had right after loading, whatever the
    previous contender did: c all NULL, the heap rewritten compactly with a
    fresh primary-key index (VACUUM FULL, so no contender inherits the dead
    tuples and free space of the one before), the visibility map set (VACUUM)
    and fresh statistics (ANALYZE). CHECKPOINT writes out the dirty buffers,
    so nobody pays for the previous contender's writes. The table stays in
    the OS page cache for all of them alike."""
    execute(url, f"UPDATE {TABLE} SET c = NULL WHERE c IS NOT NULL",
            f"VACUUM FULL {TABLE}", f"VACUUM (ANALYZE) {TABLE}")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        execute(url, "CHECKPOINT")


def verify(url: str, rows: int, who: str) -> None:
    total, wrong = query_one(
        url, f"SELECT count(*), count(*) FILTER (WHERE c IS DISTINCT FROM md5(b)) FROM {TABLE}")
    if total != rows or wrong:
        raise BenchError(f"{who}: {wrong} of {total} rows differ from md5(b) (expected {rows} rows)")
    print(f"    verified: all {total:,} rows have c = md5(b)", flush=True)


def rows_updated(url: str) -> int:
    """n_tup_upd of the table: every row version written by an UPDATE, in
    committed and in rolled-back transactions alike."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT n_tup_upd FROM pg_stat_user_tables "
                           "WHERE schemaname = 'bench' AND relname = 'items'").fetchone()
    return int(row[0]) if row else 0


# --- contenders (2), (3), (4) ---------------------------------------------------------


def run_single_update(url: str) -> float:
    with timed("one UPDATE") as lap:
        execute(url, f"UPDATE {TABLE} SET c = md5(b)")
    return lap.seconds


def run_chunked_sql(url: str) -> float:
    low, high = query_one(url, f"SELECT min(id), max(id) FROM {TABLE}")
    starts = iter(range(int(low), int(high) + 1, CHUNK_ROWS))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def updater() -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                while True:
                    with lock:
                        lo = next(starts, None)
                    if lo is None:
                        return
                    conn.execute(f"UPDATE {TABLE} SET c = md5(b) WHERE id >= %s AND id < %s",
                                 (lo, lo + CHUNK_ROWS))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with timed(f"chunked SQL ({SQL_CONNECTIONS} connections)") as lap:
        threads = [threading.Thread(target=updater) for _ in range(SQL_CONNECTIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise BenchError(f"chunked SQL failed: {errors[0]}")
    return lap.seconds


def run_plain_spark(url: str, partitions: int) -> PlainSpark:
    cmd = [sys.executable, "-P", str(BENCH_DIR / "plain_spark.py"), "--db", url,
           "--partitions", str(partitions)]
    with timed("plain Spark (process)") as lap:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=clean_env())
    if done.returncode != 0:
        raise BenchError(f"plain Spark job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    laps = json.loads(done.stdout.strip().splitlines()[-1])
    result = PlainSpark(lap.seconds, laps["with_session"], laps["job"], laps["session_start"],
                        laps["spark_read_transform_write"], laps["update_from_staging"])
    print(f"    SparkSession start {result.session_start:.2f} s, read+md5+write "
          f"{result.read_transform_write:.2f} s, UPDATE ... FROM {result.update:.2f} s", flush=True)
    return result


# --- reorg: CLI, worker processes, samplers ---------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without REORG_* knobs (a stray REORG_BATCH_ROWS would
    change what is measured), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REORG_")}
    return env | extra


def reorg(url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cli.main", "--db", url, *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=clean_env())
    if check and done.returncode != 0:
        raise BenchError(f"`reorg {' '.join(args)}` exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    node_id: str
    log_path: Path
    launched: float  # epoch seconds
    sampler: RssSampler
    registered_after: float = float("nan")
    spark_ready_after: float | None = None  # launch -> SparkSession started (warm-up)
    spark_seconds: float | None = None  # how long that start took


def start_worker(url: str, node_id: str, log_dir: Path) -> Worker:
    log_path = log_dir / f"{node_id}.log"
    with open(log_path, "wb") as log:
        launched = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_BOOT, "worker", "--slots", str(WORKER_SLOTS),
             "--node-id", node_id],
            cwd=REPO, env=clean_env(REORG_DATABASE_URL=url), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sampler = RssSampler(proc.pid)
    sampler.start()
    worker = Worker(proc, node_id, log_path, launched, sampler)
    try:
        wait_registered(url, worker)
    except BaseException:
        kill_tree(worker)
        raise
    print(f"    worker {node_id} (pid {proc.pid}) registered after "
          f"{worker.registered_after:.2f} s", flush=True)
    return worker


@contextlib.contextmanager
def running_worker(url: str, node_id: str, log_dir: Path) -> Iterator[Worker]:
    worker = start_worker(url, node_id, log_dir)
    try:
        yield worker
    finally:
        stop_worker(worker)


def wait_registered(url: str, worker: Worker, timeout: float = 120.0) -> None:
    """Poll `reorg nodes --json` until the worker is listed; its registration
    time is the node row's started_at (database clock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            raise BenchError(f"worker {worker.node_id} exited with {worker.proc.returncode}; "
                             f"see {worker.log_path}")
        nodes = json.loads(reorg(url, "nodes", "--json").stdout or "[]")
        mine = [n for n in nodes if n["node_id"] == worker.node_id]
        if mine:
            started = dt.datetime.fromisoformat(mine[0]["started_at"]).timestamp()
            worker.registered_after = started - worker.launched
            return
        time.sleep(0.1)
    raise BenchError(f"worker {worker.node_id} did not register within {timeout:.0f}s")


def wait_spark_ready(worker: Worker, timeout: float = 90.0) -> None:
    """Wait until the worker's own Spark warm-up has started its SparkSession
    (a long-running worker has Spark up before jobs arrive). A worker that
    does not warm up on its own starts Spark in its first job instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in worker.log_path.read_text(errors="replace").splitlines():
            if failed := SPARK_FAILED_RE.search(line):
                raise BenchError(f"worker {worker.node_id}: {failed.group(0)}")
            started, stamp = SPARK_START_RE.search(line), LOG_TIME_RE.match(line)
            if started and stamp:
                worker.spark_seconds = float(started.group(1))
                worker.spark_ready_after = log_time(stamp.group(1)) - worker.launched
                print(f"    its SparkSession started {worker.spark_ready_after:.2f} s after launch "
                      f"(took {worker.spark_seconds:.2f} s)", flush=True)
                return
        if worker.proc.poll() is not None:
            raise BenchError(f"worker {worker.node_id} exited; see {worker.log_path}")
        time.sleep(0.1)
    print(f"    worker did not start Spark within {timeout:.0f} s; its first job will", flush=True)


def log_time(stamp: str) -> float:
    """A worker log's asctime (local time) as epoch seconds."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def stop_worker(worker: Worker) -> None:
    """SIGTERM (drain, deregister); SIGKILL if it does not exit in a minute."""
    if worker.proc.poll() is None:
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(60)
        except subprocess.TimeoutExpired:
            kill_tree(worker)
    worker.sampler.stop()


def kill_tree(worker: Worker) -> None:
    """SIGKILL the worker and its JVM at once, as a crashed host would lose them."""
    if worker.proc.poll() is None:
        for pid in process_tree(worker.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.proc.wait()
    worker.sampler.stop()


def committed_rows(conn: psycopg.Connection[Any], job_id: int) -> int:
    """The job's checkpointed row count: live and finished subtasks."""
    row = conn.execute(
        f"SELECT (SELECT coalesce(sum(row_count), 0) FROM {SYSTEM_SCHEMA}.background_subtask "
        f"        WHERE job_id = %(j)s) "
        f"     + (SELECT coalesce(sum(row_count), 0) FROM {SYSTEM_SCHEMA}.background_subtask_history "
        f"        WHERE job_id = %(j)s)", {"j": job_id}).fetchone()
    return int(row[0]) if row else 0


class ProgressSampler(threading.Thread):
    """Polls a job's committed rows every PROGRESS_SECONDS: (epoch time, rows)."""

    def __init__(self, url: str, job_id: int) -> None:
        super().__init__(daemon=True)
        self.url, self.job_id = url, job_id
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop_event.is_set():
                self.samples.append((time.time(), committed_rows(conn, self.job_id)))
                self._stop_event.wait(PROGRESS_SECONDS)

    def latest(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def first_time_above(self, rows: int, after: float = 0.0) -> float | None:
        return next((t for t, r in self.samples if t >= after and r > rows), None)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def submit(url: str, job_type: str) -> tuple[int, float]:
    with timed(f"reorg submit {job_type}") as lap:
        done = reorg(url, "submit", job_type, "--table", TABLE, "--set", "c=md5(b)", "--json")
    return int(json.loads(done.stdout)["id"]), lap.seconds


def wait_job(url: str, job_id: int) -> None:
    done = reorg(url, "wait", str(job_id), check=False)
    if done.returncode != 0:
        raise BenchError(f"`reorg wait {job_id}` exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()}")


# --- reorg: one timed run ------------------------------------------------------------


def log_lines(path: Path, since: float, until: float = float("inf")) -> list[str]:
    """Lines of a worker log stamped within [since, until] (epoch seconds)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        match = LOG_TIME_RE.match(line)
        if match:
            stamp = log_time(match.group(1))
            if since <= stamp <= until:
                out.append(line)
    return out


def batch_stats(lines: list[str], subtask_ids: set[int]) -> Batches:
    found = [m for m in map(BATCH_RE.search, lines) if m and int(m.group(1)) in subtask_ids]
    if not found:
        return Batches()
    rows = [int(m.group(4)) for m in found]
    reads = [float(m.group(5)) for m in found]
    merges = [float(m.group(6)) for m in found]
    return Batches(len(found), statistics.median(rows), max(rows), statistics.median(reads),
                   statistics.median(merges), sum(reads), sum(merges))


class SubtaskRow(NamedTuple):
    id: int
    started: float  # epoch seconds, database clock
    finished: float
    row_count: int
    attempts: int


@dataclass
class Timeline:
    """A finished job as the system tables record it."""

    created: float  # epoch seconds, database clock
    started: float
    subtasks: list[SubtaskRow]


def job_timeline(url: str, job_id: int) -> Timeline:
    columns = ("id, extract(epoch FROM started_at)::float8, extract(epoch FROM finished_at)::float8, "
               "row_count, attempts")
    with psycopg.connect(url, autocommit=True) as conn:
        job = conn.execute(
            f"SELECT extract(epoch FROM created_at)::float8, extract(epoch FROM started_at)::float8 "
            f"FROM {SYSTEM_SCHEMA}.jobs WHERE id = %s", (job_id,)).fetchone()
        # The owner moves finished subtasks to history after the job ends: read both.
        subtasks = conn.execute(
            f"SELECT {columns} FROM {SYSTEM_SCHEMA}.background_subtask WHERE job_id = %(j)s "
            f"UNION ALL SELECT {columns} FROM {SYSTEM_SCHEMA}.background_subtask_history "
            f"WHERE job_id = %(j)s", {"j": job_id}).fetchall()
    assert job is not None
    return Timeline(job[0], job[1], [SubtaskRow(*row) for row in subtasks])


def run_reorg(url: str, rows: int, job_type: str, worker: Worker, label: str) -> ReorgRun:
    began = time.time()
    clock = time.perf_counter()
    job_id, submit_seconds = submit(url, job_type)
    progress = ProgressSampler(url, job_id)
    progress.start()
    try:
        wait_job(url, job_id)
    finally:
        progress.stop()
    total = time.perf_counter() - clock
    ended = time.time()
    print(f"    reorg {job_type} ({label}): submit -> wait exit 0 in {total:.2f} s", flush=True)
    verify(url, rows, f"reorg {job_type}")
    timeline = job_timeline(url, job_id)
    subtasks = timeline.subtasks
    first_start = min(s.started for s in subtasks)
    last_finish = max(s.finished for s in subtasks)
    first_commit = progress.first_time_above(0)
    lines = log_lines(worker.log_path, began - 1, ended + 1)
    spark = [float(m.group(1)) for m in map(SPARK_START_RE.search, lines) if m]
    peak, split = worker.sampler.peak(began, ended)
    return ReorgRun(
        job_type=job_type, label=label, total=total, submit=submit_seconds,
        created=timeline.created - began,
        queued=timeline.started - timeline.created,
        first_commit=(first_commit - began) if first_commit else float("nan"),
        processing=last_finish - first_start, finish=ended - last_finish,
        subtasks=len(subtasks), peak_rss=peak, peak_split=split,
        batches=batch_stats(lines, {s.id for s in subtasks}),
        spark_start=spark[0] if spark else None)


def contend(url: str, neighbours: Neighbours, retries: int, run: Callable[[], T]
            ) -> tuple[T, float | None]:
    """Reset the table, wait for a quiet machine and run one contender; run it
    again (up to ``retries`` times) when other processes took a sizeable share
    of the CPUs meanwhile. Returns the last result and the CPU seconds other
    processes used during it."""
    attempt = 0
    while True:
        reset_table(url)
        neighbours.settle()
        with neighbours.measured() as others:
            result = run()
        if not others.disturbed or attempt == retries:
            return result, others.cpu_seconds
        attempt += 1
        print(f"    other processes took {others.cpu_seconds:.1f} s of CPU meanwhile: again",
              flush=True)


def run_reorg_contender(url: str, rows: int, job_type: str, log_dir: Path,
                        neighbours: Neighbours, retries: int) -> tuple[WorkerStartup, list[ReorgRun]]:
    """A fresh worker, registered and (for Spark job types) with Spark started
    before the clock; its first job, then a second one on the same worker, as
    a long-running worker sees jobs. Only the second is repeated when
    disturbed: a repeat of the first would not be a first job."""
    print(f"  `reorg worker --slots {WORKER_SLOTS}` for {job_type}", flush=True)
    with running_worker(url, f"bench-{job_type}", log_dir) as worker:
        if job_type in SPARK_JOB_TYPES:
            wait_spark_ready(worker)
        runs = []
        for label, tries in (("first", 0), ("second", retries)):
            run, others_cpu = contend(url, neighbours, tries,
                                      partial(run_reorg, url, rows, job_type, worker, label))
            run.others_cpu = others_cpu
            runs.append(run)
    startup = WorkerStartup(worker.registered_after, worker.spark_ready_after, worker.spark_seconds)
    return startup, runs


# --- reorg: kill -9 mid-job ---------------------------------------------------------------


@contextlib.contextmanager
def statement_log(server: Server) -> Iterator[int | None]:
    """log_statement = 'all' for the duration; yields the log offset to read
    from, or None when the server log is not ours to read or change."""
    if server.log_file is None:
        yield None
        return
    execute(server.url, "ALTER SYSTEM SET log_statement = 'all'", "SELECT pg_reload_conf()")
    time.sleep(0.2)  # the postmaster re-reads the file asynchronously
    offset = server.log_file.stat().st_size
    try:
        yield offset
    finally:
        execute(server.url, "ALTER SYSTEM RESET log_statement", "SELECT pg_reload_conf()")


def range_reads(text: str, rows: int) -> list[RangeRead]:
    """The table's range reads in a piece of server log (keys are dense
    1..rows, so a range [lo, hi) holds hi - lo rows after clipping)."""
    out = []
    for match in RANGE_READ_RE.finditer(text):
        stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        lo, hi = max(int(match.group(2)), 1), min(int(match.group(3)), rows + 1)
        if hi > lo:
            out.append(RangeRead(stamp, lo, hi))
    return out


def in_flight_subtasks(url: str, job_id: int) -> tuple[list[InFlight], dict[int, int]]:
    """Subtasks running at the kill (all held by the killed worker) and their lease epochs."""
    with psycopg.connect(url, autocommit=True) as conn:
        held = conn.execute(
            f"SELECT id, curr_key, end_key, epoch FROM {SYSTEM_SCHEMA}.background_subtask "
            f"WHERE job_id = %s AND state = 'running' ORDER BY id", (job_id,)).fetchall()
    return ([InFlight(int(h[0]), int(h[1]), int(h[2])) for h in held],
            {int(h[0]): int(h[3]) for h in held})


def wait_reclaimed(url: str, epochs: dict[int, int], timeout: float = 600.0) -> None:
    """Until every subtask in ``epochs`` was claimed again (its lease epoch
    grew) or has left the live table."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            now = {int(i): int(e) for i, e in conn.execute(
                f"SELECT id, epoch FROM {SYSTEM_SCHEMA}.background_subtask WHERE id = ANY(%s)",
                (list(epochs),)).fetchall()}
            if all(now.get(i, e + 1) > e for i, e in epochs.items()):
                return
            time.sleep(PROGRESS_SECONDS)
    raise BenchError(f"subtasks {sorted(epochs)} were not claimed again within {timeout:.0f}s")


def run_reorg_killed(server: Server, rows: int, job_type: str, log_dir: Path) -> KillRun:
    url, log_file = server.url, server.log_file
    reset_table(url)
    time.sleep(1.0)  # let the reset's statistics reach the cumulative stats
    updated_before = rows_updated(url)
    print(f"  kill -9 run ({job_type}): worker A runs the job until {KILL_AT:.0%} is committed",
          flush=True)
    with statement_log(server) as log_start:
        with running_worker(url, "bench-kill-a", log_dir) as first:
            if job_type in SPARK_JOB_TYPES:
                wait_spark_ready(first)
            began = time.perf_counter()
            job_id, _ = submit(url, job_type)
            progress = ProgressSampler(url, job_id)
            progress.start()
            try:
                while progress.latest() < KILL_AT * rows:
                    if first.proc.poll() is not None:
                        raise BenchError(f"worker A exited early; see {first.log_path}")
                    time.sleep(PROGRESS_SECONDS / 2)
                kill_tree(first)
            finally:
                progress.stop()
        killed = time.perf_counter()
        log_at_kill = log_file.stat().st_size if log_file else None
        in_flight, epochs = in_flight_subtasks(url, job_id)
        with psycopg.connect(url, autocommit=True) as conn:
            at_kill = committed_rows(conn, job_id)
        print(f"    SIGKILLed worker A and its JVM with {at_kill:,} rows committed, "
              f"{len(in_flight)} subtasks in flight", flush=True)
        # Stopping B ends its server sessions, which flush their statistics.
        with running_worker(url, "bench-kill-b", log_dir):
            wait_reclaimed(url, epochs)
            reclaimed = time.perf_counter() - killed
            print(f"    in-flight subtasks claimed again {reclaimed:.1f} s after the kill", flush=True)
            wait_job(url, job_id)
            total = time.perf_counter() - began
        time.sleep(1.0)
    print(f"    job {job_id} finished {total:.1f} s after submit", flush=True)
    verify(url, rows, f"reorg {job_type} after kill -9")
    rows_read = None
    if log_file is not None and log_start is not None and log_at_kill is not None:
        with open(log_file, "rb") as log:
            log.seek(log_start)
            raw = log.read()
        (log_dir / "postgres-kill-run.log").write_bytes(raw)
        rows_read = sum(r.hi - r.lo for r in range_reads(raw.decode(errors="replace"), rows))
        before_kill = range_reads(raw[:log_at_kill - log_start].decode(errors="replace"), rows)
        for sub in in_flight:
            sub.lost_reads = [r for r in before_kill if sub.committed_to <= r.lo < sub.end_key]
    subtasks = job_timeline(url, job_id).subtasks
    (batch_rows,) = query_one(url, f"SELECT batch_rows FROM {SYSTEM_SCHEMA}.jobs WHERE id = %s",
                              (job_id,))
    return KillRun(
        job_type=job_type, killed_at_rows=at_kill, in_flight=in_flight,
        reclaimed_after=reclaimed, total=total,
        committed_sum=sum(s.row_count for s in subtasks),
        rows_updated=rows_updated(url) - updated_before,
        rows_read=rows_read or None,  # no range reads at all: sql-update
        attempts=sum(s.attempts for s in subtasks), batch_rows=int(batch_rows))


# --- main ---------------------------------------------------------------------------


# Prints the archive's path ("" when disabled) and builds it if missing.
_BUILD_ARCHIVE = """
from backfill.spark import cds, session
archive = session.cds_archive()
print(archive or "")
raise SystemExit(0 if archive is None or cds.build(archive) else 1)
"""


def build_spark_archive() -> str:
    """Build the Spark class-data archive reorg's processes start from, before
    anything is timed: a worker would otherwise build it in the background
    during the first reorg run. Returns how the report should describe it."""
    done = subprocess.run([sys.executable, "-c", _BUILD_ARCHIVE], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True)
    archive = done.stdout.strip()
    if not archive:
        return "off"
    if done.returncode != 0:
        print(f"warning: Spark class-data archive not built: {done.stderr.strip()[-500:]}",
              flush=True)
        return "failed to build (reorg's JVMs start without it)"
    return "on for reorg's worker and `reorg submit` JVMs (the plain Spark job has none)"


def check_job_type(job_type: str) -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group="reorg.job_types")}
    if job_type not in names:
        raise SystemExit(f"error: job type {job_type!r} is not registered (entry point group "
                         f"reorg.job_types has: {', '.join(sorted(names)) or 'none'}); "
                         "reinstall with `pip install -e .` or use --job-type sql-update")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows in bench.items")
    parser.add_argument("--db", help="postgresql:// URL of an existing server (TCP host); "
                        "default: a throwaway local cluster")
    parser.add_argument("--skip-reorg", action="store_true", help="only the baselines (2)-(4)")
    parser.add_argument("--job-type", choices=["backfill", "sql-update", "both"],
                        default="backfill", help="reorg job type(s) for contender (1)")
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 run")
    parser.add_argument("--spark-partitions", type=int, default=SPARK_PARTITIONS,
                        help="JDBC read partitions of the plain Spark job")
    parser.add_argument("--quiet-wait", type=float, default=120.0, metavar="SECONDS",
                        help="before each contender, wait up to this long for other processes "
                        "to leave the CPUs alone (0: don't wait)")
    parser.add_argument("--retries", type=int, default=2,
                        help="run a contender again, up to this often, when other processes took "
                        "over 10%% of the CPUs while it ran")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="markdown report to write")
    return parser.parse_args(argv)


def shown_command(argv: Sequence[str]) -> str:
    """The command line for the report, with the database URL (it may hold a
    password) left out."""
    shown, hide = [], False
    for arg in argv:
        shown.append("URL" if hide else re.sub(r"^--db=.*", "--db=URL", arg))
        hide = arg == "--db"
    return " ".join(["python bench/backfill.py", *shown])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    job_types = [] if args.skip_reorg else (
        ["backfill", "sql-update"] if args.job_type == "both" else [args.job_type])
    for job_type in job_types:
        check_job_type(job_type)
    started = time.perf_counter()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-bench-logs-"))
    with database(args.db) as server:
        url = server.url
        print(f"building {TABLE} with {args.rows:,} rows", flush=True)
        with timed("build") as build:
            build_table(url, args.rows)
        # Without our own server, its work would count as other processes': don't measure.
        neighbours = Neighbours([os.getpid(), server.postmaster] if server.postmaster else [],
                                args.quiet_wait)
        others_cpu: dict[str, float | None] = {}

        def baseline(name: str, run: Callable[[], T]) -> T:
            print(name, flush=True)
            result, others_cpu[name] = contend(url, neighbours, args.retries, run)
            verify(url, args.rows, name)
            return result

        single = baseline("one UPDATE", lambda: run_single_update(url))
        chunked = baseline("chunked SQL", lambda: run_chunked_sql(url))
        plain = baseline("plain Spark", lambda: run_plain_spark(url, args.spark_partitions))
        (pg_version,) = query_one(url, "SELECT version()")
        res = Results(shown_command(sys.argv[1:]), args.rows, machine(pg_version), stamp,
                      "`--db` server" if args.db else "throwaway local cluster, durability off",
                      build.seconds, single, chunked, plain, others_cpu=others_cpu)
        if job_types:
            res.machine["Spark class-data archive"] = build_spark_archive()
            print("(1) reorg", flush=True)
            reorg(url, "db", "upgrade")
            for job_type in job_types:
                startup, runs = run_reorg_contender(url, args.rows, job_type, log_dir, neighbours,
                                                    args.retries)
                res.worker_startup[job_type] = startup
                res.reorg_runs += runs
            if not args.no_kill:
                res.kill = run_reorg_killed(server, args.rows, job_types[0], log_dir)
        res.wall = time.perf_counter() - started
        neighbours.stop()
    print("\n".join(["", "results", *summary_lines(res)]), flush=True)
    write_doc(res, args.doc)
    if job_types:
        print(f"written to {args.doc}; worker and kill-run server logs in {log_dir}", flush=True)
    else:
        log_dir.rmdir()
        print(f"written to {args.doc}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        sys.exit(f"error: {exc}")
