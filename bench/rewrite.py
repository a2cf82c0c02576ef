"""``rewrite`` against pg_repack, ``VACUUM FULL`` and a plain ``ALTER TABLE``
on a bloated ``pgbench_accounts``, an application running pgbench's TPC-B
transaction the whole time (but during the offline floors)::

    python -m bench.rewrite                       # scale 100 (10,000,000 rows), both forms
    python -m bench.rewrite --scale 20 --rounds 3 # 2,000,000 rows, the median of 3 rounds
    python -m bench.rewrite --scale 2 --forms repack
    python -m bench.rewrite --db postgresql://me@127.0.0.1:5432/scratch --pg-repack PATH

For each contender, on the same fresh table: ``pgbench -i -s SCALE``, one
secondary index (``abalance``), a third of the rows updated once and
vacuumed (the bloat every contender removes), a CHECKPOINT. Then the
application (2 sessions running pgbench's built-in TPC-B transaction,
through psycopg so the run stops exactly when the contender ends, each
statement and transaction timed) runs a few seconds alone (its baseline
TPS), then through the contender. The forms (``--forms``):

- repack: ``VACUUM FULL pgbench_accounts`` (offline: it locks the table, so
  no application; the floor), ``pg_repack --no-order --table
  pgbench_accounts`` (1.4.8; the server needs the extension: Debian's
  ``postgresql-15-repack``), ``reorg submit rewrite --table
  pgbench_accounts`` (the default: every range verified) and the same
  with ``--verify off`` (nothing compared, as pg_repack);
- alter: ``ALTER TABLE pgbench_accounts ALTER COLUMN aid TYPE bigint``
  (offline) and ``reorg submit rewrite --alter "ALTER COLUMN aid TYPE
  bigint"``.

reorg runs on one in-process node of 2 slots, default knobs (``--rate``:
``--max-rows-per-sec``), started and elected owner before the clock starts
and drained after it stops, as a deployed ``reorg worker`` runs before and
after a job: reorg's wall time is its job's, from the submit to its end.
With ``--rounds N`` every contender runs N times, round after round (so a
load on the machine falls on all of them alike), and the median of each
figure is printed. The server is a durable
throwaway cluster (fsync, full-page writes) unless ``--db`` is given.

Printed: wall time and its ratio to pg_repack's, to VACUUM FULL's and to
the plain ALTER's; the longest application statement and transaction; TPS
during the run against the baseline; WAL bytes written during the run (the
application's included: the same for every contender but the offline
ones); the table's size after; and for reorg the seconds and WAL of each
of its steps (verify includes the swap, which commits with the move to
the swapped step).

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.dataplane.server import add_fast_server, database
from bench.dataplane.tracking import job_status, node_in_process
from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.submit import SubmitRequest, submit

BASELINE_SECONDS = 3.0
ALTER = "ALTER COLUMN aid TYPE bigint"
FORMS = ("repack", "alter")
ENDED = ("succeeded", "failed", "reverted", "cancelled")


class Application(threading.Thread):
    """One session running pgbench's TPC-B transaction in a loop, each
    statement and transaction timed."""

    def __init__(self, url: str, scale: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.url, self.scale, self.random = url, scale, random.Random(seed)
        self.stop_event = threading.Event()
        self.longest, self.longest_statement, self.transactions, self.errors = 0.0, 0.0, 0, 0
        self.longest_statement_at = (0.0, "")  # when it began (monotonic), what it was
        self.window_started = time.monotonic()

    def run(self) -> None:
        r = self.random
        with psycopg.connect(self.url, prepare_threshold=None) as conn:
            while not self.stop_event.is_set():
                aid, tid = r.randint(1, 100_000 * self.scale), r.randint(1, 10 * self.scale)
                bid, delta = r.randint(1, self.scale), r.randint(-5000, 5000)
                statements = [
                    ("UPDATE pgbench_accounts SET abalance = abalance + %s WHERE aid = %s",
                     (delta, aid)),
                    ("SELECT abalance FROM pgbench_accounts WHERE aid = %s", (aid,)),
                    ("UPDATE pgbench_tellers SET tbalance = tbalance + %s WHERE tid = %s",
                     (delta, tid)),
                    ("UPDATE pgbench_branches SET bbalance = bbalance + %s WHERE bid = %s",
                     (delta, bid)),
                    ("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
                     "VALUES (%s, %s, %s, %s, CURRENT_TIMESTAMP)", (tid, bid, aid, delta))]
                started = time.monotonic()
                try:
                    for statement, params in statements:
                        at = time.monotonic()
                        conn.execute(statement, params)  # type: ignore[arg-type]
                        self._timed(statement, at)
                    at = time.monotonic()
                    conn.commit()
                    self._timed("COMMIT", at)
                except psycopg.Error:
                    conn.rollback()
                    self.errors += 1
                    continue
                self.longest = max(self.longest, time.monotonic() - started)
                self.transactions += 1

    def _timed(self, statement: str, at: float) -> None:
        took = time.monotonic() - at
        if took > self.longest_statement:
            self.longest_statement, self.longest_statement_at = took, (at, statement)

    def window(self) -> tuple[int, float, float, float]:
        """Transactions, seconds, the longest transaction and statement since the last call."""
        now = time.monotonic()
        seen = (self.transactions, now - self.window_started, self.longest,
                self.longest_statement)
        self.transactions, self.window_started = 0, now
        self.longest, self.longest_statement = 0.0, 0.0
        return seen


@dataclass
class Result:
    seconds: float
    wal_bytes: int
    longest: float | None  # seconds; None: no application ran
    longest_statement: float | None
    tps: float | None
    baseline_tps: float | None
    size_after: int
    steps: list[tuple[str, float, int]] = field(default_factory=list)  # reorg's: name, s, WAL
    # The longest application statement: its first words and, for reorg,
    # the step it began in.
    longest_where: str = ""


def prepare_table(url: str, scale: int) -> None:
    subprocess.run(["pgbench", "-i", "-q", "-s", str(scale), "-I", "dtgvp", url], check=True,
                   capture_output=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE INDEX pgbench_accounts_abalance ON pgbench_accounts (abalance)")
        conn.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 3 = 0")
        conn.execute("VACUUM ANALYZE pgbench_accounts")
        conn.execute("CHECKPOINT")  # no contender pays for the preparation's dirty pages


def wal_lsn(url: str) -> str:
    with psycopg.connect(url) as conn:
        return str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]


def wal_since(url: str, lsn: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                                (lsn,)).fetchone()[0])  # type: ignore[index]


def size(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT pg_total_relation_size('pgbench_accounts')")
                   .fetchone()[0])  # type: ignore[index]


class Window:
    """The measured part of a contender's run, from ``open`` to ``close``:
    the application's baseline TPS up to ``open``, its TPS, longest
    statement and transaction, and the WAL written, between the two."""

    def __init__(self, url: str, apps: list[Application]) -> None:
        self.url, self.apps = url, apps
        self.started = self.seconds = 0.0
        self.lsn, self.wal = "", 0
        self.baseline: float | None = None
        self.during: list[tuple[int, float, float, float]] = []
        self.ats: list[tuple[float, str]] = []

    def open(self) -> None:
        self.baseline = _tps([a.window() for a in self.apps])
        self.lsn = wal_lsn(self.url)
        self.started = time.monotonic()

    def close(self) -> None:
        self.seconds = time.monotonic() - self.started
        self.wal = wal_since(self.url, self.lsn)
        self.ats = [a.longest_statement_at for a in self.apps]
        self.during = [a.window() for a in self.apps]


# A contender: given the server's URL and the window to open when its work
# begins and close when it ends, runs to its end; returns reorg's steps
# (name, seconds, WAL bytes), or none.
Contender = Callable[[str, Window], list[tuple[str, float, int]]]


def offline(statement: str) -> Contender:
    def run(url: str, window: Window) -> list[tuple[str, float, int]]:
        with psycopg.connect(url, autocommit=True) as conn:
            window.open()
            conn.execute(statement)  # type: ignore[arg-type]
            window.close()
        return []
    return run


def pg_repack(binary: str) -> Contender:
    def run(url: str, window: Window) -> list[tuple[str, float, int]]:
        # pg_repack 1.4.8 takes no connection URI: its parts as options.
        at = psycopg.conninfo.conninfo_to_dict(url)
        options = [f"--{name}={at[key]}" for name, key in (
            ("host", "host"), ("port", "port"), ("username", "user"), ("dbname", "dbname"))
            if at.get(key)]
        env = {**os.environ, **({"PGPASSWORD": str(at["password"])} if at.get("password") else {})}
        window.open()
        done = subprocess.run([binary, "--no-order", "--table", "pgbench_accounts", *options],
                              capture_output=True, text=True, env=env)
        window.close()
        if done.returncode != 0:
            raise SystemExit(f"pg_repack failed: {done.stderr.strip()}")
        return []
    return run


def reorg_rewrite(rate: int | None, **params: object) -> Contender:
    return reorg_job("rewrite", rate, **params)


def reorg_job(job_type: str, rate: int | None, **params: object) -> Contender:
    """The job from its submit to its end, on a node started before (as a
    deployed ``reorg worker`` runs before and after a job: its start, the
    owner's election and its drain are not the job's) and idle meanwhile."""
    def run(url: str, window: Window) -> list[tuple[str, float, int]]:
        with node_in_process(url) as db:
            owner_elected(url)
            window.open()
            steps = run_with_steps(db, url, SubmitRequest(
                job_type, {"table": "pgbench_accounts", **params}, max_rows_per_sec=rate))
            window.close()
        return steps
    return run


def owner_elected(url: str, timeout: float = 30.0) -> None:
    """Wait until the bench's node (``node_in_process``) holds the owner lease."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute("SELECT EXISTS (SELECT 1 FROM reorg.owner_lease "
                            "WHERE owner_id = 'bench' AND expires_at > now())").fetchone()[0]:  # type: ignore[index]
                return
            time.sleep(0.05)
    raise SystemExit("error: the bench node was not elected owner")


def run_with_steps(db: Database, url: str, request: SubmitRequest) -> list[tuple[str, float, int]]:
    """Submit ``request`` and poll (every 50 ms) until its job ended; the
    seconds and WAL bytes of each step it was seen in. Stops the benchmark
    with the job's error unless it succeeded."""
    steps: list[tuple[str, float, int]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        def lsn() -> int:
            return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
                       .fetchone()[0])  # type: ignore[index]

        seen, since, at = "submit", time.monotonic(), lsn()
        job_id = submit(db, request).job_id
        if job_id is None:
            raise SystemExit("error: the submit wrote no job")
        while True:
            job = job_status(db, job_id)
            state = str(job["state"])
            now = ("prepare" if state == "queued" else str(job.get("step_name") or state)
                   if state not in ENDED else state)
            if now != seen:
                wal = lsn()
                steps.append((seen, time.monotonic() - since, wal - at))
                seen, since, at = now, time.monotonic(), wal
            if state in ENDED:
                break
            time.sleep(0.05)
    if state != "succeeded":
        raise SystemExit(f"error: rewrite job {job_id} ended {state}: {job['error']}")
    return steps


def measure(url: str, scale: int, contender: Contender, with_app: bool) -> Result:
    prepare_table(url, scale)
    apps = [Application(url, scale, seed) for seed in range(2)] if with_app else []
    for app in apps:
        app.start()
    time.sleep(BASELINE_SECONDS if apps else 0)
    window = Window(url, apps)
    steps = contender(url, window)
    took, wal, ats, during, started = (window.seconds, window.wal, window.ats, window.during,
                                       window.started)
    baseline = window.baseline
    for app in apps:
        app.stop_event.set()
        app.join(60)
    where = ""
    if apps:
        top = max(range(len(apps)), key=lambda i: during[i][3])
        at, statement = ats[top]
        where = " ".join(statement.split()[:2])
        ends = [(name, sum(s for _, s, _ in steps[:i + 1])) for i, (name, _, _) in
                enumerate(steps)]
        step = next((name for name, end in ends if at - started < end), None)
        where += f", in {step} ({at - started:.1f} s in)" if step else ""
    return Result(took, wal, max((w[2] for w in during), default=None),
                  max((w[3] for w in during), default=None), _tps(during), baseline, size(url),
                  steps, where)


def _tps(windows: list[tuple[int, float, float, float]]) -> float | None:
    if not windows:
        return None
    return sum(w[0] for w in windows) / max(w[1] for w in windows)


def contenders(forms: list[str], repack_binary: str | None,
               rate: int | None) -> list[tuple[str, Contender, bool]]:
    """(name, run, with the application) of each contender of ``forms``."""
    paced = f" --max-rows-per-sec {rate}" if rate else ""
    chosen: list[tuple[str, Contender, bool]] = []
    if "repack" in forms:
        chosen.append(("VACUUM FULL (offline)", offline("VACUUM FULL pgbench_accounts"), False))
        if repack_binary:
            chosen.append(("pg_repack 1.4.8 --no-order", pg_repack(repack_binary), True))
        chosen.append((f"reorg rewrite{paced}", reorg_rewrite(rate), True))
        chosen.append((f"reorg rewrite --verify off{paced}", reorg_rewrite(rate, verify="off"),
                       True))
    if "alter" in forms:
        chosen.append((f"ALTER TABLE ... {ALTER} (offline)",
                       offline(f"ALTER TABLE pgbench_accounts {ALTER}"), False))
        chosen.append((f"reorg rewrite --alter \"{ALTER}\"{paced}",
                       reorg_rewrite(rate, alter=ALTER), True))
    return chosen


def run(url: str, scale: int, chosen: list[tuple[str, Contender, bool]],
        rounds: int) -> dict[str, list[Result]]:
    migrate.upgrade(Database(Settings(url)))
    from backfill.rewrite.job import register

    register()  # whether or not the installed entry points know it yet
    if any(name.startswith("pg_repack") for name, _, _ in chosen):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_repack")
    results: dict[str, list[Result]] = {}
    for round_ in range(1, rounds + 1):
        for name, contender, with_app in chosen:
            result = measure(url, scale, contender, with_app)
            results.setdefault(name, []).append(result)
            app = (f", longest statement {result.longest_statement * 1000:.0f} ms, transaction "
                   f"{result.longest * 1000:.0f} ms, TPS {result.tps:.0f} (baseline "
                   f"{result.baseline_tps:.0f})"
                   if result.longest is not None and result.longest_statement is not None
                   and result.tps and result.baseline_tps else "")
            steps = "".join(f"\n    {step}: {s:.2f} s, WAL {w / 2**20:.0f} MiB"
                            for step, s, w in result.steps)
            where = f" ({result.longest_where})" if result.longest_where else ""
            print(f"round {round_}: {name}: {result.seconds:.2f} s, WAL "
                  f"{result.wal_bytes / 2**20:.0f} MiB{app}{where}{steps}", flush=True)
    return results


def median(results: list[Result]) -> Result:
    """Each figure's median over the rounds (steps: each step's)."""
    def mid(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    by_name: dict[str, list[tuple[float, int]]] = {}
    for r in results:
        for name, seconds, wal in r.steps:
            by_name.setdefault(name, []).append((seconds, wal))
    steps = [(name, statistics.median(s for s, _ in seen), int(statistics.median(w for _, w in seen)))
             for name, seen in by_name.items()]
    return Result(statistics.median(r.seconds for r in results),
                  int(statistics.median(r.wal_bytes for r in results)),
                  mid([r.longest for r in results]), mid([r.longest_statement for r in results]),
                  mid([r.tps for r in results]), mid([r.baseline_tps for r in results]),
                  int(statistics.median(r.size_after for r in results)), steps)


def report(scale: int, rounds: int, results: dict[str, list[Result]]) -> None:
    med = {name: median(rs) for name, rs in results.items()}

    def first(prefix: str) -> Result | None:
        return next((r for n, r in med.items() if n.startswith(prefix)), None)

    floors = {"repack": first("VACUUM FULL"), "alter": first("ALTER TABLE")}
    repack = first("pg_repack")
    of = f"median of {rounds} rounds" if rounds > 1 else "one round"
    print(f"\n| pgbench_accounts, scale {scale} ({scale * 100_000:,} rows, a third updated), "
          f"{of} | wall time | vs pg_repack | vs its offline floor | longest app statement "
          "| longest app transaction | TPS (baseline) | WAL | size after |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for name, r in med.items():
        alter = "--alter" in name or name.startswith("ALTER")
        floor = floors["alter" if alter else "repack"]
        vs_repack = f"{r.seconds / repack.seconds:.2f}x" if repack and not alter else "–"
        vs_floor = f"{r.seconds / floor.seconds:.2f}x" if floor else "–"
        app = (f"{r.longest_statement * 1000:.0f} ms | {r.longest * 1000:.0f} ms | "
               f"{r.tps:.0f} ({r.baseline_tps:.0f})"
               if r.tps is not None and r.longest is not None and r.longest_statement is not None
               and r.baseline_tps is not None else "– | – | –")
        print(f"| {name} | {r.seconds:.2f} s | {vs_repack} | {vs_floor} | {app} "
              f"| {r.wal_bytes / 2**20:.0f} MiB | {r.size_after / 2**20:.0f} MiB |")
    for name, r in med.items():
        if r.steps:
            print(f"\n{name}, by step: " + ", ".join(
                f"{step} {s:.2f} s ({w / 2**20:.0f} MiB WAL)" for step, s, w in r.steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=100, help="pgbench scale (100,000 rows each)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every contender, round after round; medians printed")
    parser.add_argument("--forms", default=",".join(FORMS),
                        help=f"comma-separated, of: {', '.join(FORMS)}")
    parser.add_argument("--db", help="postgresql:// URL; default: a durable throwaway server "
                                     "under /tmp")
    parser.add_argument("--pg-repack", default=shutil.which("pg_repack")
                        or "/usr/lib/postgresql/15/bin/pg_repack",
                        help="the pg_repack client (the server needs its extension)")
    parser.add_argument("--rate", type=int, help="the rewrite's --max-rows-per-sec")
    add_fast_server(parser)
    args = parser.parse_args()
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    unknown = [f for f in forms if f not in FORMS]
    if unknown or not forms:
        parser.error(f"--forms {args.forms}: give some of {', '.join(FORMS)}")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    repack = args.pg_repack if Path(args.pg_repack).exists() else None
    if repack is None and "repack" in forms:
        print(f"pg_repack not found at {args.pg_repack}: left out (apt install "
              "postgresql-15-repack)")
    chosen = contenders(forms, repack, args.rate)
    with database(args.db, durable=not args.fast_server) as server:
        results = run(server.url, args.scale, chosen, max(args.rounds, 1))
    report(args.scale, max(args.rounds, 1), results)


if __name__ == "__main__":
    main()
