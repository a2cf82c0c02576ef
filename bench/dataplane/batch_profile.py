"""Where an ``sql-update`` batch's time goes: ``python -m bench.dataplane.batch_profile``.

Runs sql-update jobs on ``bench.items`` with one in-process node (2 slots),
the statements reorg issues timed as they run: every statement a worker slot
sends (SQLAlchemy's cursor events, on the slot threads only, so the owner's
and the heartbeat's are not counted) and every commit, classified by what it
is for. Printed as milliseconds per batch, for a job overwriting a column
that holds old values (a before-image per row) and one adding the column (no
images), so the image write is the difference between their update
statements. The figures are wall times on a shared machine: read them as
shares of a batch.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bench.dataplane.records import TABLE
from bench.dataplane.reorg_cli import reorg
from bench.dataplane.server import build_table, database, reset_table, tool_parser
from bench.dataplane.statement_timing import timing_statements

# What a statement is for, by its text; the first match wins.
KINDS = [
    ("claim", re.compile(r"^\s*WITH job AS", re.S)),
    ("lease renewal", re.compile(r"SET exec_expired", re.S)),
    ("next-batch key scan", re.compile(r"SELECT max\(k\), count\(\*\)", re.S)),
    # The statement that finds its own bound (sparse keys: backfill.update_batch).
    ("update, bound scanned in it", re.compile(r"reorg_bound", re.S)),
    # Old values all NULL: the bare UPDATE of the NULL rows, guarded by a probe
    # or, on dense integer ranges, without one (backfill.update_batch).
    ("update, guarded (old values NULL)",
     re.compile(r"reorg_probe|^\s*UPDATE .*num_nulls\(", re.S)),
    ("update + before-images", re.compile(r"reorg_read", re.S)),
    ("locked fallback", re.compile(r"reorg_locked", re.S)),
    # add-column: the application's explicit NULLs put back (backfill.add_column.owned).
    ("fix-up of explicit NULLs", re.compile(r"reorg_o\.is_null", re.S)),
    ("job setting", re.compile(r"set_config\('reorg\.job'", re.S)),
    ("update", re.compile(rf"UPDATE {re.escape(TABLE)}|UPDATE \"bench\".\"items\"", re.S)),
    ("batch record", re.compile(r"_batches\" \(subtask_id", re.S)),
    ("checkpoint", re.compile(r"SET\s+curr_key", re.S)),
    ("last-subtask check", re.compile(r"state IN \('pending', 'running'\)", re.S)),
    ("session settings", re.compile(r"^\s*SET ", re.S)),
]
COMMIT = "commit"


class StatementClock:
    """Seconds and counts per kind of statement, from worker slot threads."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def kind(self, statement: str) -> str:
        return next((name for name, pattern in KINDS if pattern.search(statement)), "other")

    def add(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.seconds[kind] += seconds
            self.count[kind] += 1

    @contextmanager
    def installed(self) -> Iterator[None]:
        def on_slot() -> bool:
            return threading.current_thread().name.startswith("slot-")

        def statement(text: str, seconds: float) -> None:
            if on_slot():
                self.add(self.kind(text), seconds)

        def commit(seconds: float) -> None:
            if on_slot():
                self.add(COMMIT, seconds)

        with timing_statements(statement, commit):
            yield


def run_job(url: str, params: dict[str, str], rows: int,
            batch_rows: int) -> tuple[StatementClock, float, int]:
    """One sql-update job on a fresh in-process node; its statement clock, its
    wall time from submit to succeeded, and its batches (``rows`` on dense
    keys, ``batch_rows`` each)."""
    from bench.dataplane.tracking import run_to_success
    from framework.config import Settings
    from framework.db import Database
    from framework.node import Node
    from framework.submit import SubmitRequest

    settings = Settings(database_url=url)
    db = Database(settings)
    clock = StatementClock()
    node = Node(settings, node_id="profile", slots=2)
    with clock.installed():
        node.start()
        try:
            wall = run_to_success(db, SubmitRequest("sql-update", {"table": TABLE, **params},
                                                    batch_rows=batch_rows))
        finally:
            node.drain(timeout=30)
    db.dispose()
    # A batch is one statement, or two where the guard fell back to the images.
    return clock, wall, -(-rows // batch_rows)


def report(name: str, clock: StatementClock, wall: float, batches: int) -> list[str]:
    total = sum(clock.seconds.values())
    lines = [f"{name}: {batches} batches, job {wall:.2f} s (submit to succeeded), "
             f"{total / batches * 1000:.1f} ms of statements and commits per batch "
             "(2 slots at once)"]
    for kind, seconds in sorted(clock.seconds.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {kind:<36} {seconds / batches * 1000:7.2f} ms/batch  "
                     f"{seconds / total:6.1%}  ({clock.count[kind]} calls)")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = tool_parser("bench.dataplane.batch_profile", __doc__, rows=400_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    args = parser.parse_args(argv)
    with database(args.db, durable=not args.fast_server) as server:
        build_table(server.url, args.rows)
        reorg(server.url, "db", "upgrade")
        out = []
        for name, params, old_values in [
                ("overwrite (c holds old values: a before-image per row)",
                 {"set": "c=md5(b)"}, True),
                ("overwrite of c all NULL (no image: the guarded bare UPDATE)",
                 {"set": "c=md5(b)"}, False),
                ("--add-column d:text (no images)",
                 {"set": "d=md5(b)", "add_column": "d:text"}, False)]:
            reset_table(server.url, old_values=old_values)
            clock, wall, batches = run_job(server.url, params, args.rows, args.batch_rows)
            out += report(name, clock, wall, batches)
    print("\n".join(out))


if __name__ == "__main__":
    main()
