"""An application writing to a table while a schema-change job runs, and
the oracle of what the table must hold: one thread inserting, updating and
deleting rows of ``items(id, a, b, ...)`` in short transactions, recording
each committed row in a dict (the oracle) and timing every statement, so a
test can compare the table with the oracle and a bench can report the
longest wait (a statement stuck behind a lock).

By default rows are named by a serial ``id`` (the oracle's keys are ints);
with ``keys=AppKeys(...)`` by a key of any type, one column or several, that
the app makes up for each insert (the oracle's keys are then tuples)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from support.db import ATTOPTIONS


@dataclass(frozen=True)
class AppKeys:
    """A table's key for the app: its columns, and the key of the app's n-th
    insert (a tuple of Python values as psycopg reads them back: str, UUID,
    Decimal, datetime, int), never one the table holds already."""

    columns: tuple[str, ...]
    new: Callable[[int], tuple[Any, ...]]

    @property
    def select(self) -> str:
        return ", ".join(self.columns)

    @property
    def match(self) -> str:
        return " AND ".join(f"{c} = %s" for c in self.columns)


class App(threading.Thread):
    """``value(n)`` is what the app writes into ``a`` for a number n (an int,
    or its text for a text column); ``read(v)`` how the oracle reads it back
    from the table after the job (e.g. int for text → int)."""

    def __init__(self, url: str, *, seed: int = 7, value: Callable[[int], Any] = int,
                 pause: float = 0.002, table: str = "items",
                 keys: AppKeys | None = None) -> None:
        super().__init__(name="app", daemon=True)
        self.url, self.table, self.pause = url, table, pause
        self.value = value
        self.keys = keys
        self.random = random.Random(seed)
        self.stop_event = threading.Event()
        self.oracle: dict[Any, tuple[Any, str]] = {}
        self.ops = 0
        self.errors: list[str] = []
        self.longest = 0.0  # seconds of the slowest statement
        self._lock = threading.Lock()

    def load(self) -> None:
        """Start from the table's current rows."""
        self.oracle.update(table_as_oracle(self.url, self.table, self.keys))

    def run(self) -> None:
        # No server-side prepared statements: a prepared INSERT ... RETURNING id
        # fails after any change of id's type ("cached plan must not change
        # result type"), as it does after ALTER TABLE ... TYPE (README).
        with psycopg.connect(self.url, autocommit=True, prepare_threshold=None) as conn:
            while not self.stop_event.is_set():
                try:
                    self._one(conn)
                except psycopg.Error as exc:
                    self.errors.append(str(exc).splitlines()[0])
                self.ops += 1
                self.stop_event.wait(self.pause)

    def _timed(self, conn: psycopg.Connection, statement: str, params: tuple) -> list[tuple]:
        started = time.monotonic()
        rows = conn.execute(statement, params).fetchall()  # type: ignore[arg-type]
        self.longest = max(self.longest, time.monotonic() - started)
        return rows

    def _one(self, conn: psycopg.Connection) -> None:
        t, r = self.table, self.random
        roll = r.random()
        n = r.randrange(1_000_000)
        if roll < 0.4 or not self.oracle:
            b = f"app {self.ops} {n}"  # unique: a UNIQUE (a, b) never trips on the app
            key = self._insert(conn, self.value(n), b)
            self.oracle[key] = (self.value(n), b)
        elif roll < 0.8:
            key = r.choice(list(self.oracle))
            b = f"upd {self.ops} {n}"
            done = self._timed(conn, f"UPDATE {t} SET a = %s, b = %s WHERE {self._match} "
                                     "RETURNING 1", (self.value(n), b, *self._key_values(key)))
            if done:
                self.oracle[key] = (self.value(n), b)
        else:
            key = r.choice(list(self.oracle))
            self._timed(conn, f"DELETE FROM {t} WHERE {self._match} RETURNING 1",
                        self._key_values(key))
            del self.oracle[key]

    @property
    def _match(self) -> str:
        return self.keys.match if self.keys else "id = %s"

    def _key_values(self, key: Any) -> tuple[Any, ...]:
        return key if self.keys else (key,)

    def _insert(self, conn: psycopg.Connection, a: Any, b: str) -> Any:
        if self.keys is None:
            [(key,)] = self._timed(conn, f"INSERT INTO {self.table} (a, b) VALUES (%s, %s) "
                                         "RETURNING id", (a, b))
            return key
        key = self.keys.new(self.ops)
        holes = ", ".join(["%s"] * (len(key) + 2))
        self._timed(conn, f"INSERT INTO {self.table} ({self.keys.select}, a, b) "
                          f"VALUES ({holes}) RETURNING 1", (*key, a, b))
        return key

    def stop(self, at_least_ops: int = 0, timeout: float = 60) -> None:
        """Stop once ``at_least_ops`` more statements ran (writes after the job too)."""
        target = self.ops + at_least_ops
        deadline = time.monotonic() + timeout
        while self.ops < target and time.monotonic() < deadline and self.is_alive():
            time.sleep(0.01)
        self.stop_event.set()
        self.join(timeout)


def table_as_oracle(url: str, table: str = "items",
                    keys: AppKeys | None = None) -> dict[Any, tuple[Any, str]]:
    """The table's rows as the oracle holds them: key (an int id, or a tuple
    of the key's columns) -> (a, b)."""
    with psycopg.connect(url) as conn:
        if keys is None:
            return {k: (a, b) for k, a, b in conn.execute(f"SELECT id, a, b FROM {table}")}
        width = len(keys.columns)
        return {tuple(r[:width]): (r[width], r[width + 1])
                for r in conn.execute(f"SELECT {keys.select}, a, b FROM {table}")}


def column_catalog(url: str, table: str = "items") -> dict[str, Any]:
    """The facts a type change must keep, by name (never by attnum or oid)."""
    with psycopg.connect(url) as conn:
        q = lambda s: conn.execute(s, {"t": table}).fetchall()  # noqa: E731
        return {
            "columns": sorted(q("""
                SELECT attname, format_type(atttypid, atttypmod), attnotnull,
                       pg_get_expr(d.adbin, d.adrelid), col_description(attrelid, attnum)
                FROM pg_attribute a LEFT JOIN pg_attrdef d
                  ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                WHERE attrelid = %(t)s::regclass AND attnum > 0 AND NOT attisdropped""")),
            "indexes": sorted(q("""
                SELECT c.relname, regexp_replace(pg_get_indexdef(i.indexrelid), ' USING btree', ''),
                       i.indisprimary, i.indisunique, i.indisvalid,
                       obj_description(i.indexrelid, 'pg_class')
                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                WHERE i.indrelid = %(t)s::regclass""")),
            "constraints": sorted(q("""
                SELECT conname, contype, pg_get_constraintdef(oid), convalidated,
                       obj_description(oid, 'pg_constraint')
                FROM pg_constraint WHERE conrelid = %(t)s::regclass""")),
            "sequences": sorted(q("""
                SELECT s.relname, a.attname FROM pg_depend d
                JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
                JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.refobjid = %(t)s::regclass AND d.deptype = 'a'""")),
            "triggers": sorted(q("SELECT tgname FROM pg_trigger WHERE tgrelid = %(t)s::regclass "
                                 "AND NOT tgisinternal")),
            "functions": sorted(q("SELECT proname FROM pg_proc WHERE proname LIKE 'alter_type_%%'")),
            # Privileges granted on a column, its statistics target and options.
            "column_settings": sorted(q(f"""
                SELECT attname, attstattarget, {ATTOPTIONS},
                       (SELECT array_agg(grant_ ORDER BY grant_)
                        FROM (SELECT format('%%s:%%s:%%s:%%s', pg_get_userbyid(g.grantor),
                                            CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                                 ELSE pg_get_userbyid(g.grantee) END,
                                            g.privilege_type, g.is_grantable) AS grant_
                              FROM aclexplode(attacl) g) grants)
                FROM pg_attribute WHERE attrelid = %(t)s::regclass AND attnum > 0
                  AND NOT attisdropped""")),
        }
