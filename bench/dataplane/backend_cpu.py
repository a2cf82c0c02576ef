"""CPU of every PostgreSQL backend while reorg's ``--add-column`` job runs and
while chunked SQL does the same writes: ``python -m bench.dataplane.backend_cpu``.

Wall times on a shared 2-core machine move by a third from one run to the
next; the server's CPU for the same writes does not. This shows it per
backend (named by ``application_name``: reorg's worker slots are
``reorg-worker``, chunked SQL's connections ``client backend``), so a
difference in the server's work, not only in waiting, shows up, and which
connections do it. It found a worker's batches rotating over three pooled
connections (20 % more CPU in the backends than chunked SQL) before the pool
handed a slot back its last connection. Printed, not written.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import mkdtemp

import psycopg

from bench.dataplane import reorg_cli, workers
from bench.dataplane.baselines import run_chunked_sql
from bench.dataplane.proctree import stat_fields
from bench.dataplane.server import build_table, database, reset_table, tool_parser

HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process so far; None once it has exited."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / HZ


class BackendCpu:
    """Samples ``pg_stat_activity`` every 20 ms on a thread of its own and
    keeps each backend's first and last CPU reading: what it used while
    sampled (a backend's CPU before its first sample is not counted)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._name: dict[int, str] = {}
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> BackendCpu:
        self._thread.start()
        time.sleep(0.1)  # a first reading of every backend already open
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.is_set():
                for pid, name in conn.execute(
                        "SELECT pid, coalesce(nullif(application_name, ''), backend_type) "
                        "FROM pg_stat_activity WHERE pid <> pg_backend_pid()").fetchall():
                    seconds = cpu_seconds(pid)
                    if seconds is not None:
                        self._first.setdefault(pid, seconds)
                        self._last[pid] = seconds
                        self._name[pid] = name
                self._stop.wait(0.02)

    def used(self) -> list[tuple[str, int, float]]:
        """(name, pid, CPU seconds) of every backend that used 10 ms or more."""
        rows = [(self._name[pid], pid, self._last[pid] - self._first[pid]) for pid in self._last]
        return sorted((r for r in rows if r[2] >= 0.01), key=lambda r: -r[2])


def report(label: str, wall: float, used: list[tuple[str, int, float]]) -> str:
    by_name: dict[str, float] = {}
    for name, _, seconds in used:
        by_name[name] = by_name.get(name, 0.0) + seconds
    backends = ", ".join(f"{name} {pid} {seconds:.2f} s" for name, pid, seconds in used)
    names = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in by_name.items())
    return f"{label}: {wall:.2f} s wall; CPU by name: {names}\n    per backend: {backends}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = tool_parser("bench.dataplane.backend_cpu", __doc__, rows=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with database(args.db, durable=not args.fast_server) as server:
        url = server.url
        build_table(url, args.rows, autovacuum=False)
        reorg_cli.reorg(url, "db", "upgrade")
        with workers.running_worker(url, f"backend-cpu-{os.getpid()}", Path(mkdtemp())):
            reset_table(url)
            reorg_cli.WaitingSubmit(url, "sql-update", reorg_cli.ADD_D).wait()  # warms the worker
            for n in range(1, args.rounds + 1):
                for label in ("chunked SQL", "reorg --add-column"):
                    reset_table(url)
                    with BackendCpu(url) as backends:
                        clock = time.perf_counter()
                        if label == "chunked SQL":
                            run_chunked_sql(url)
                        else:
                            reorg_cli.WaitingSubmit(url, "sql-update", reorg_cli.ADD_D).wait()
                        wall = time.perf_counter() - clock
                    print(report(f"round {n}, {label}", wall, backends.used()), flush=True)


if __name__ == "__main__":
    main()
