"""A concurrent application for the add-index and add-column tests (alter-type's
is support.app; the two could share one): a thread inserting, updating and
deleting rows of ``items(id, a, b, c)`` the whole time a job
runs, and the oracle of what the table must hold afterwards (its ``model``:
every row as the application last committed it).

Its writes keep ``b`` unique (``'n' || id`` on insert, ``'u' || id || '_' ||
n`` on update), so a unique index on ``b`` stays buildable; ``a`` is updated
too, a column a job's ``--value`` may not read (an UPDATE that does not
touch the columns EXPR reads must still give the new column its value).
Every write stamps ``c`` with the database's clock at the row, so a test can
tell the rows written after a job's cut-over from those written before.

``survives_crashes``: a write whose connection is lost (PostgreSQL crashed
under it) may or may not have committed. The application then reads the row
once the server answers again and keeps what it finds if that is the write
(or the row as it was): the oracle stays exact across a crash, and only a
row that is neither is an error.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from support.db import wait_until

Row = tuple[int, int | None, str | None, str | None]


@dataclass(frozen=True)
class Write:
    """One write the application means to make: ``new`` is the row's (id, a,
    b) after it, None for a delete; ``old`` the model's row before it."""

    op: str
    key: int
    old: Row | None
    new: tuple[int, int | None, str | None] | None


class Application:
    def __init__(self, engine: sa.Engine, *, seed: int = 13,
                 survives_crashes: bool = False) -> None:
        self.engine = engine
        self.survives_crashes = survives_crashes
        self.lost_connections = 0  # writes whose outcome was read back after a crash
        self.random = random.Random(seed)
        with engine.begin() as conn:
            self.model: dict[int, Row] = {
                r[0]: tuple(r) for r in conn.execute(sa.text("SELECT id, a, b, c FROM items"))}
        self.next_id = max(self.model, default=0) + 1_000_000
        self.writes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="application", daemon=True)

    def __enter__(self) -> Application:
        self._thread.start()
        wait_until(lambda: self.writes >= 5, 30, "the application's first writes")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait_writes(self, more: int, timeout: float = 30) -> None:
        target = self.writes + more
        wait_until(lambda: self.writes >= target, timeout, f"{more} more application writes")

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            write = self._plan(self.random.choice(("insert", "update_b", "update_a", "delete")), n)
            try:
                with self.engine.connect() as conn:
                    stamp = self._apply(conn, write)  # commits
                self._record(write, stamp)
                self.writes += 1
            except sa.exc.OperationalError as exc:
                if self.survives_crashes:
                    self.lost_connections += 1
                    self._settle(write)
                else:
                    self._fail(write, exc)
            except sa.exc.DBAPIError as exc:  # kept for the test to assert on
                self._fail(write, exc)
            self._stop.wait(0.002)

    def _fail(self, write: Write, exc: sa.exc.DBAPIError) -> None:
        self.errors.append(f"{write.op}: {exc.orig}")
        self._stop.wait(0.05)

    def _plan(self, op: str, n: int) -> Write:
        ids = list(self.model)
        if op == "insert" or not ids:
            key, self.next_id = self.next_id, self.next_id + 1
            return Write("insert", key, None, (key, n % 97, f"n{key}"))
        key = self.random.choice(ids)
        old = self.model[key]
        if op == "delete":
            return Write(op, key, old, None)
        a, b = ((old[1], f"u{key}_{n}") if op == "update_b" else ((old[1] or 0) + 1, old[2]))
        return Write(op, key, old, (key, a, b))

    @staticmethod
    def _apply(conn: sa.Connection, write: Write) -> str | None:
        """The write, committed; the stamp ``c`` it wrote."""
        if write.new is None:
            conn.execute(sa.text("DELETE FROM items WHERE id = :i"), {"i": write.key})
            stamp = None
        elif write.old is None:
            stamp = conn.execute(sa.text(
                "INSERT INTO items (id, a, b, c) VALUES (:i, :a, :b, clock_timestamp()::text) "
                "RETURNING c"), dict(zip("iab", write.new, strict=True))).scalar()
        else:
            stamp = conn.execute(sa.text(
                "UPDATE items SET a = :a, b = :b, c = clock_timestamp()::text WHERE id = :i "
                "RETURNING c"), dict(zip("iab", write.new, strict=True))).scalar()
        conn.commit()
        return stamp

    def _record(self, write: Write, stamp: str | None) -> None:
        if write.new is None:
            del self.model[write.key]
        else:
            self.model[write.key] = (*write.new, stamp)

    def _settle(self, write: Write) -> None:
        """Read back a write whose connection was lost: committed or not."""
        while not self._stop.is_set():
            try:
                with self.engine.connect() as conn:
                    found = conn.execute(sa.text("SELECT id, a, b, c FROM items WHERE id = :i"),
                                         {"i": write.key}).one_or_none()
                break
            except sa.exc.OperationalError:
                self._stop.wait(0.1)  # the server is not back yet
        else:
            self.errors.append(f"{write.op} of {write.key}: outcome never read back")
            return
        row = None if found is None else tuple(found)
        if row == write.old:
            return  # not committed
        if write.new is None and row is None:
            del self.model[write.key]
        elif row is not None and write.new is not None and row[:3] == write.new:
            self.model[write.key] = row  # type: ignore[assignment]
        else:
            self.errors.append(f"{write.op} of {write.key}: after the crash the row is {row}, "
                               f"neither {write.old} nor the write {write.new}")

    def expected(self) -> list[Row]:
        """The table's rows (id, a, b, c) the application's writes leave."""
        return sorted(self.model.values())


def shape(engine: sa.Engine, table: str = "items") -> dict[str, list[tuple]]:
    """What a rolled-back schema change must leave exactly as it was: the
    table's columns, constraints, indexes and triggers, and any function or
    work table of reorg's left behind."""
    queries = {
        "columns": """SELECT attname, format_type(atttypid, atttypmod), attnotnull,
                             pg_get_expr(d.adbin, d.adrelid)
                      FROM pg_attribute a LEFT JOIN pg_attrdef d
                        ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                      WHERE attrelid = CAST(:t AS regclass) AND attnum > 0 AND NOT attisdropped
                      ORDER BY attnum""",
        "constraints": """SELECT conname, pg_get_constraintdef(oid), convalidated
                          FROM pg_constraint WHERE conrelid = CAST(:t AS regclass) ORDER BY 1""",
        "indexes": """SELECT indexrelid::regclass::text, indisvalid, pg_get_indexdef(indexrelid)
                      FROM pg_index WHERE indrelid = CAST(:t AS regclass) ORDER BY 1""",
        "triggers": """SELECT tgname FROM pg_trigger
                       WHERE tgrelid = CAST(:t AS regclass) AND NOT tgisinternal ORDER BY 1""",
        "functions": """SELECT proname FROM pg_proc WHERE proname LIKE 'add_column_%' ORDER BY 1""",
        "work_tables": """SELECT relname FROM pg_class WHERE relname LIKE 'add_column_%'
                          ORDER BY 1""",
    }
    with engine.begin() as conn:
        return {name: [tuple(r) for r in conn.execute(sa.text(q), {"t": table})]
                for name, q in queries.items()}


def data(engine: sa.Engine, columns: str = "id, a, b, c") -> list[tuple]:
    with engine.begin() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT {columns} FROM items ORDER BY id"))]
