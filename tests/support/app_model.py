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
"""

from __future__ import annotations

import random
import threading
from typing import Any

import sqlalchemy as sa

from support.db import wait_until

Row = tuple[int, int | None, str | None, str | None]


class Application:
    def __init__(self, engine: sa.Engine, *, seed: int = 13) -> None:
        self.engine = engine
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
            op = self.random.choice(("insert", "update_b", "update_a", "delete"))
            try:
                with self.engine.connect() as conn:
                    self._write(conn, op, n)  # commits, then updates the model
                self.writes += 1
            except sa.exc.DBAPIError as exc:  # kept for the test to assert on
                self.errors.append(f"{op}: {exc.orig}")
                self._stop.wait(0.05)
            self._stop.wait(0.002)

    def _write(self, conn: sa.Connection, op: str, n: int) -> None:
        ids = list(self.model)
        if op == "insert" or not ids:
            key, self.next_id = self.next_id, self.next_id + 1
            stamp = conn.execute(sa.text(
                "INSERT INTO items (id, a, b, c) VALUES (:i, :a, :b, clock_timestamp()::text) "
                "RETURNING c"), {"i": key, "a": n % 97, "b": f"n{key}"}).scalar()
            conn.commit()
            self.model[key] = (key, n % 97, f"n{key}", stamp)
            return
        key = self.random.choice(ids)
        if op == "delete":
            conn.execute(sa.text("DELETE FROM items WHERE id = :i"), {"i": key})
            conn.commit()
            del self.model[key]
            return
        old = self.model[key]
        a, b = ((old[1], f"u{key}_{n}") if op == "update_b" else ((old[1] or 0) + 1, old[2]))
        stamp = conn.execute(sa.text(
            "UPDATE items SET a = :a, b = :b, c = clock_timestamp()::text WHERE id = :i "
            "RETURNING c"), {"i": key, "a": a, "b": b}).scalar()
        conn.commit()
        self.model[key] = (key, a, b, stamp)

    def expected(self) -> list[Row]:
        """The table's rows (id, a, b, c) the application's writes leave."""
        return sorted(self.model.values())


def shape(engine: sa.Engine, table: str = "items") -> dict[str, list[tuple]]:
    """What a rolled-back schema change must leave exactly as it was: the
    table's columns, constraints, indexes and triggers, and any function of
    reorg's left behind."""
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
    }
    with engine.begin() as conn:
        return {name: [tuple(r) for r in conn.execute(sa.text(q), {"t": table})]
                for name, q in queries.items()}


def data(engine: sa.Engine, columns: str = "id, a, b, c") -> list[tuple]:
    with engine.begin() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT {columns} FROM items ORDER BY id"))]
