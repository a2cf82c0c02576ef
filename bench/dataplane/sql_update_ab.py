"""``sql-update`` against chunked SQL, this checkout and a baseline checkout
taking turns on the same server: ``python -m bench.dataplane.sql_update_ab
[--baseline PATH]``.

Issue 9's two ``sql-update`` ratios, without the rest of the data-plane
benchmark (no Spark): ``--add-column`` against (3) chunked SQL, and an
overwrite of old values (a before-image per row) against (3) on the same old
values, with PostgreSQL alone writing the same images (the floor). Each
round runs, for the baseline and then this checkout, each checkout's own
``reorg worker --slots 2`` (its warm-up job first, on a small table) and its
own ``reorg submit --wait`` process, every contender right after
a reset of the table (``server.reset_table``). On a shared machine only the
ratios within a round say anything; the report gives each round's. Printed,
not written.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from bench.dataplane import reorg_cli, workers
from bench.dataplane.baselines import run_chunked_sql
from bench.dataplane.proctree import tree_cpu_ticks
from bench.dataplane.records import TABLE
from bench.dataplane.server import build_table, database, execute, reset_table, tool_parser, verify
from bench.dataplane.tracking import job_timeline, system_tables

T = TypeVar("T")
THIS = reorg_cli.REPO
WARM_TABLE = "bench.warm"


def _use(repo: Path) -> None:
    """Run the ``reorg`` command and workers from ``repo``'s sources, on
    system tables of their own (a baseline may know fewer migrations)."""
    reorg_cli.REPO = workers.REPO = repo  # type: ignore[misc]
    os.environ["REORG_SCHEMA"] = _schema(repo)


def _schema(repo: Path) -> str:
    return "reorg" if repo == THIS else "reorg_baseline"


HZ = os.sysconf("SC_CLK_TCK")
ROOTS: list[int] = []  # this process and the PostgreSQL server: every process at work


def _cpu_ticks() -> int:
    return tree_cpu_ticks(ROOTS)


def _settled_cpu_ticks(deadline: float = 3.0) -> int:
    """``_cpu_ticks()`` once two readings 0.1 s apart agree. A backend that
    ended just before (the table's reset, which reloads it) moves its CPU into
    the server's once the server reaps it: read too soon, the next contender
    was charged with it (chunked SQL once showed 15.5 CPU-s for 4.7 s)."""
    ticks, until = _cpu_ticks(), time.monotonic() + deadline
    while time.monotonic() < until:
        time.sleep(0.1)
        ticks, last = _cpu_ticks(), ticks
        if ticks == last:
            break
    return ticks


def _cpu(out: dict[str, float], name: str, run: Callable[[], T]) -> T:
    """``run()``, with the CPU seconds every process at work used meanwhile
    (the server's backends, the worker, the `reorg` commands, this process's
    SQL connections) as ``out[name + " cpu"]``: steadier than wall time while
    others load the machine."""
    before = _settled_cpu_ticks()
    result = run()
    out[f"{name} cpu"] = (_cpu_ticks() - before) / HZ
    return result


def _job(url: str, rows: int, args: tuple[str, ...], column: str,
         extra: tuple[str, ...] = ()) -> dict[str, float]:
    """One ``reorg submit sql-update --wait``: the wall time and its parts
    (subtasks first start → last end, and the rest), and the CPU every
    process at work used until the command's exit (``cpu``; the check of
    every row after it is not the job's)."""
    ticks = _settled_cpu_ticks()
    began, clock = time.time(), time.perf_counter()
    job = reorg_cli.WaitingSubmit(url, "sql-update", (*args, *extra))
    job.wait()
    job_id, submit_seconds = job.job_id, job.submit_seconds
    total = time.perf_counter() - clock
    cpu = (_cpu_ticks() - ticks) / HZ
    verify(url, rows, "reorg sql-update", column)
    with system_tables(url) as db:
        timeline = job_timeline(db, job_id)
    first = min(s.started for s in timeline.subtasks)
    last = max(s.finished for s in timeline.subtasks)
    return {"total": total, "cpu": cpu, "submit": submit_seconds, "subtasks": last - first,
            "fixed": total - (last - first), "created": timeline.created - began,
            "queued": timeline.started - timeline.created, "claimed": first - timeline.started,
            "waited": began + total - last}


def _round(url: str, rows: int, repo: Path, log_dir: Path, label: str,
           extra: tuple[str, ...]) -> dict[str, float]:
    _use(repo)
    out: dict[str, float] = {}
    with workers.running_worker(url, f"ab-{label}-{os.getpid()}", log_dir) as _worker:
        execute(url, f"UPDATE {WARM_TABLE} SET c = NULL")
        done = reorg_cli.reorg(url, "submit", "sql-update", "--table", WARM_TABLE,
                               "--set", "c=md5(b)", "--json")
        reorg_cli.wait_job(url, int(json.loads(done.stdout)["id"]))  # the worker's first job warms its caches
        reset_table(url)
        out["chunked"] = _cpu(out, "chunked", lambda: run_chunked_sql(url))
        out["stack import"] = reorg_cli.stack_import_seconds()
        reset_table(url)
        for part, value in _job(url, rows, reorg_cli.ADD_D, "d", extra).items():
            out[f"add-column {part}"] = value
        reset_table(url, old_values=True)
        out["chunked old"] = _cpu(out, "chunked old", lambda: run_chunked_sql(url))
        reset_table(url, old_values=True)
        out["chunked images"] = _cpu(out, "chunked images",
                                     lambda: run_chunked_sql(url, images=True))
        reset_table(url, old_values=True)
        for part, value in _job(url, rows, reorg_cli.SET_C, "c", extra).items():
            out[f"overwrite {part}"] = value
    return out


def report(label: str, r: dict[str, float], load: tuple[float, float]) -> list[str]:
    return [
        f"{label} (load average {load[0]:.1f} before, {load[1]:.1f} after):",
        f"  --add-column / chunked SQL: {r['add-column total'] / r['chunked']:.2f} "
        f"({r['add-column total']:.2f} s / {r['chunked']:.2f} s); subtasks "
        f"{r['add-column subtasks']:.2f} s ({r['add-column subtasks'] / r['chunked']:.2f}x), "
        f"the rest {r['add-column fixed']:.2f} s (submit command {r['add-column submit']:.2f} s); "
        f"floor (chunked SQL + a process importing the CLI's stack, "
        f"{r['stack import']:.2f} s) {(r['chunked'] + r['stack import']) / r['chunked']:.2f}",
        f"    the rest: submit start -> job row {r['add-column created']:.2f} s, -> running "
        f"{r['add-column queued']:.2f} s, -> first subtask {r['add-column claimed']:.2f} s; "
        f"last subtask end -> wait exit {r['add-column waited']:.2f} s",
        f"  overwrite / chunked SQL on old values: {r['overwrite total'] / r['chunked old']:.2f} "
        f"({r['overwrite total']:.2f} s / {r['chunked old']:.2f} s); subtasks "
        f"{r['overwrite subtasks']:.2f} s ({r['overwrite subtasks'] / r['chunked old']:.2f}x), "
        f"the rest {r['overwrite fixed']:.2f} s; floor (chunked SQL writing the same images) "
        f"{r['chunked images'] / r['chunked old']:.2f} ({r['chunked images']:.2f} s)",
        f"  CPU of every process at work: --add-column / chunked SQL "
        f"{r['add-column cpu'] / r['chunked cpu']:.2f} ({r['add-column cpu']:.2f} s / "
        f"{r['chunked cpu']:.2f} s); overwrite / chunked SQL on old values "
        f"{r['overwrite cpu'] / r['chunked old cpu']:.2f} ({r['overwrite cpu']:.2f} s / "
        f"{r['chunked old cpu']:.2f} s), floor {r['chunked images cpu'] / r['chunked old cpu']:.2f}",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = tool_parser("bench.dataplane.sql_update_ab", __doc__, rows=2_000_000)
    parser.add_argument("--baseline", type=Path,
                        help="a checkout to compare with (e.g. `git worktree add --detach "
                             "/tmp/base main`); without it, this checkout alone")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rows-per-subtask", type=int,
                        help="passed to every timed `reorg submit` (default: reorg's)")
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-ab-logs-"))
    lines: list[str] = []
    extra = (("--rows-per-subtask", str(args.rows_per_subtask)) if args.rows_per_subtask
             else ())
    with database(args.db, durable=not args.fast_server) as server:
        ROOTS[:] = [os.getpid(), *([server.postmaster] if server.postmaster else [])]
        build_table(server.url, args.rows, autovacuum=False)
        execute(server.url, f"DROP TABLE IF EXISTS {WARM_TABLE}",
                f"CREATE TABLE {WARM_TABLE} AS SELECT * FROM {TABLE} WHERE id <= 20000",
                f"ALTER TABLE {WARM_TABLE} ADD PRIMARY KEY (id)")
        for repo in (THIS, *([args.baseline.resolve()] if args.baseline else [])):
            _use(repo)
            reorg_cli.reorg(server.url, "db", "upgrade")
        for n in range(1, args.rounds + 1):
            checkouts = [("this checkout", THIS)]
            if args.baseline:
                checkouts.insert(0, ("baseline", args.baseline.resolve()))
            for label, repo in checkouts:
                before = os.getloadavg()[0]
                result = _round(server.url, args.rows, repo, log_dir, label.split()[0], extra)
                lines += report(f"round {n}, {label} ({repo})", result,
                                (before, os.getloadavg()[0]))
                print("\n".join(lines[-5:]), flush=True)
    print("\n".join(["", "results", *lines, f"worker logs in {log_dir}"]), flush=True)


if __name__ == "__main__":
    main()
