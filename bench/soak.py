"""Soak: jobs run one after another on workers in network namespaces while an
application writer changes rows and a nemesis injects faults at random; after
every job the table is checked against its oracle. Not part of CI (a short
smoke runs under ``pytest -m matrix``)::

    python -m bench.soak --minutes 10            # root: needs ip netns and nft
    python -m bench.soak --minutes 1 --rows 20000

Jobs alternate between
- ``test-fill`` of a new int column ``dK := coalesce(dK, 0) + 1``: a row applied
  twice shows as 2, a row never applied as NULL;
- ``sql-update c := md5(b)`` while the application keeps writing ``b`` and its
  own ``c = md5(b)``: a row whose ``c`` is not ``md5(b)`` afterwards is a stale
  write the job was allowed to land.
In both, the subtasks' committed batch rows must sum to the table's rows.

Faults (one every ``--fault-every`` seconds, each healed before the next): kill -9
of a worker (restarted under its id), SIGSTOP of a worker past the lease, kill -9
of the owner, a host partitioned from PostgreSQL both ways or one way (replies
lost) past the lease, PostgreSQL crashed (``pg_ctl -m immediate``) and restarted.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))  # support.hosts and support.processes: the tests' harness

from support.db import create_database, execute, make_items, scalar  # noqa: E402
from support.fill import fill, register  # noqa: E402
from support.hosts import Host, Network, available, wait_for_postgres  # noqa: E402
from support.processes import WorkerProcess, Workers  # noqa: E402

from framework import control, migrate  # noqa: E402
from framework.config import Settings  # noqa: E402
from framework.db import Database, DatabaseUnreachable  # noqa: E402
from framework.store import owner_lease  # noqa: E402
from framework.submit import SubmitRequest, submit  # noqa: E402

LEASE = 3.0  # support.processes starts workers with 3 s leases
FAULTS = ("kill_worker", "sigstop_worker", "kill_owner", "partition_both", "partition_replies",
          "postgres_crash")
TERMINAL = {"succeeded", "cancelled", "reverted"}


@dataclass
class Tally:
    faults: Counter = field(default_factory=Counter)
    jobs: Counter = field(default_factory=Counter)
    rows: int = 0
    lost: int = 0
    duplicated: int = 0
    stale: int = 0
    miscounted: int = 0  # jobs whose committed batch rows differ from the table's rows
    app_writes: int = 0


def retrying(fn, *args, attempts: int = 60, **kw):
    """``fn`` retried through PostgreSQL restarts."""
    import sqlalchemy as sa

    for i in range(attempts):
        try:
            return fn(*args, **kw)
        except (sa.exc.OperationalError, sa.exc.InterfaceError, OSError, DatabaseUnreachable):
            if i == attempts - 1:
                raise
            time.sleep(0.5)


class Soak:
    def __init__(self, net: Network, rows: int, hosts: int, seed: int) -> None:
        self.net, self.rows, self.rng = net, rows, random.Random(seed)
        url = create_database(net.admin_url(), "soak")
        self.db = Database(Settings(url, lease_seconds=LEASE, owner_lease_seconds=LEASE))
        migrate.upgrade(self.db)
        make_items(self.db, rows)
        execute(self.db, "UPDATE items SET c = md5(b)")
        self.hosts = [net.add_host(f"s{i}") for i in range(hosts)]
        self.workers = Workers(url)
        self.procs: dict[str, tuple[WorkerProcess, Host]] = {}
        for i, host in enumerate(self.hosts):
            self.start_worker(f"n{i}", host)
        self.tally = Tally()
        self.stop = threading.Event()

    def start_worker(self, node_id: str, host) -> None:
        self.procs[node_id] = (self.workers.start(
            node_id, slots=2, prefix=host.command, REORG_MAX_ATTEMPTS="50",
            REORG_SPARK_WARMUP="false",  # no Spark job in the soak: spare the CPU a JVM costs
            REORG_DATABASE_URL=self.net.url_from_hosts("soak")), host)

    # -- the application ---------------------------------------------------------

    def app_writer(self) -> None:
        while not self.stop.is_set():
            try:
                execute(self.db, "UPDATE items SET b = b || '+', c = md5(b || '+') "
                                 "WHERE id = (random() * :n)::int + 1", {"n": self.rows - 1})
                self.tally.app_writes += 1
            except Exception:
                self.db.engine.dispose()
                time.sleep(0.2)
            time.sleep(0.005)

    # -- the nemesis -------------------------------------------------------------

    def owner(self) -> str | None:
        with self.db.begin() as conn:
            owner = owner_lease.current(self.db, conn)["owner_id"]
        return str(owner) if owner else None

    def inject(self, fault: str) -> None:
        node_id = self.rng.choice(sorted(self.procs))
        if fault == "kill_owner":
            node_id = retrying(self.owner) or node_id
        proc, host = self.procs[node_id]
        if fault in ("kill_worker", "kill_owner"):
            proc.signal(signal.SIGKILL)
            proc.proc.wait(10)
            self.start_worker(node_id, host)
        elif fault == "sigstop_worker":
            proc.signal(signal.SIGSTOP)
            time.sleep(LEASE + 2)  # the fault itself: stopped past the lease
            proc.signal(signal.SIGCONT)
        elif fault.startswith("partition"):
            host.partition("both" if fault == "partition_both" else "in")
            time.sleep(LEASE + 2)
            host.heal()
        elif fault == "postgres_crash":
            self.net.crash_postgres()
            time.sleep(1)
            self.net.start_postgres()
            wait_for_postgres(self.net.admin_url())
            self.db.engine.dispose()
        self.tally.faults[fault] += 1
        print(f"  fault: {fault} ({node_id})", flush=True)

    def nemesis(self, every: float) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 1.5) * every):
            try:
                self.inject(self.rng.choice(FAULTS))
            except Exception as exc:  # noqa: BLE001 - a failed injection is reported, not fatal
                print(f"  nemesis: {exc!r}", flush=True)

    # -- jobs and their oracle ----------------------------------------------------

    def run_job(self, k: int) -> None:
        if k % 2:
            column = f"d{k}"
            request = fill(f"coalesce({column}, 0) + 1", column=column, type="int",
                           rows_per_subtask=max(self.rows // 24, 500), batch_rows=500)
        else:
            column = "c"
            request = SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                                    rows_per_subtask=max(self.rows // 24, 500), batch_rows=500)
        job_id = retrying(submit, self.db, request).job_id
        state = None
        while state not in TERMINAL:
            time.sleep(0.5)
            state = retrying(lambda: control.status(self.db, job_id)[0]["state"])
        self.tally.jobs[f"{request.type} {state}"] += 1
        self.check(job_id, column, state)

    def check(self, job_id: int, column: str, state: str) -> None:
        counted = retrying(scalar, self.db, "SELECT coalesce(sum(row_count), 0) FROM ("
                           "SELECT row_count FROM {s}.background_subtask WHERE job_id = :j UNION ALL "
                           "SELECT row_count FROM {s}.background_subtask_history WHERE job_id = :j) x",
                           j=job_id)
        if state != "succeeded":
            print(f"  job {job_id}: {state}", flush=True)
            return
        rows = retrying(scalar, self.db, "SELECT count(*) FROM items")
        self.tally.rows += rows
        self.tally.miscounted += int(counted != rows)
        if column == "c":
            # The writer runs on: read c and b in one snapshot; a row the app
            # wrote since holds its own md5(b), so any mismatch is a stale write.
            self.tally.stale += retrying(scalar, self.db,
                                         "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)")
        else:
            self.tally.lost += retrying(scalar, self.db,
                                        f"SELECT count(*) FROM items WHERE {column} IS NULL")
            self.tally.duplicated += retrying(scalar, self.db,
                                              f"SELECT count(*) FROM items WHERE {column} > 1")
        print(f"  job {job_id} ({column}): {state}, rows {rows}, committed batch rows {counted}",
              flush=True)

    def run(self, minutes: float, fault_every: float) -> Tally:
        threads = [threading.Thread(target=self.app_writer, daemon=True),
                   threading.Thread(target=self.nemesis, args=(fault_every,), daemon=True)]
        for t in threads:
            t.start()
        ends, k = time.monotonic() + minutes * 60, 0
        try:
            while time.monotonic() < ends:
                k += 1
                self.run_job(k)
        finally:
            self.stop.set()
            for t in threads:
                t.join(30)
            for _, host in self.procs.values():
                host.heal()
            self.workers.stop_all()
        return self.tally


def table(t: Tally, minutes: float, rows: int, hosts: int) -> str:
    faults = ", ".join(f"{name} {n}" for name, n in sorted(t.faults.items())) or "none"
    jobs = ", ".join(f"{name} {n}" for name, n in sorted(t.jobs.items()))
    return "\n".join([
        "| minutes | hosts | table rows | faults injected | jobs | rows checked | lost | "
        "duplicated | stale writes accepted | miscounted jobs | app writes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {minutes:g} | {hosts} | {rows:,} | {faults} | {jobs} | {t.rows:,} | {t.lost} | "
        f"{t.duplicated} | {t.stale} | {t.miscounted} | {t.app_writes:,} |"])


def clean(t: Tally) -> bool:
    return (t.lost, t.duplicated, t.stale, t.miscounted) == (0, 0, 0, 0) and all(
        name.endswith("succeeded") for name in t.jobs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--fault-every", type=float, default=8.0, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if not available():
        print("error: the soak needs root, ip and nft (network namespaces)", file=sys.stderr)
        return 2
    register()  # test-fill, in this process (submit validates) and the workers (REORG_JOB_TYPES)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"soak: {args.minutes:g} min, {args.rows:,} rows, {args.hosts} hosts, seed {seed}", flush=True)
    net = Network()
    try:
        net.start()
        tally = Soak(net, args.rows, args.hosts, seed).run(args.minutes, args.fault_every)
    finally:
        net.stop()
    print(table(tally, args.minutes, args.rows, args.hosts))
    ok = clean(tally)
    print("verdict:", "clean" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
