"""Helpers of the rewrite engine's tests (``backfill.rewrite``), which call
its modules on a connection directly, with no worker or owner: a table with
a user trigger, an application that also updates keys and re-inserts keys
it deleted, the copy of a table's ranges by threads, and row-by-row
comparisons of the shadow with T."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill.batch_bounds import next_bound
from backfill.rewrite.shadow import Plan
from backfill.schema.sql import run
from framework.db import sqlalchemy_url
from framework.keys import END, Key, decode


def engine(url: str) -> Engine:
    return sa.create_engine(sqlalchemy_url(url), pool_size=8, max_overflow=4)


# Keys of the app's n-th key slot: one bigint, or (region text, id int).
BIGINT = ("id",), lambda n: (n,)
COMPOSITE = ("region", "id"), lambda n: (f"r{n % 3}", n)


def make_table(url: str, key: tuple[tuple[str, ...], Callable[[int], tuple]], rows: int,
               table: str = "items") -> None:
    """``table`` keyed by ``key``, with a, b, and c set by a BEFORE trigger
    of the user's to length(b): the row as the user's trigger leaves it."""
    columns, make = key
    key_ddl = "id bigint" if columns == ("id",) else "region text, id int"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE {table} ({key_ddl}, a int, b text, c int,
                                  PRIMARY KEY ({', '.join(columns)}));
            CREATE FUNCTION {table}_c() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN NEW.c := length(NEW.b); RETURN NEW; END $$;
            CREATE TRIGGER {table}_c BEFORE INSERT OR UPDATE ON {table}
                FOR EACH ROW EXECUTE FUNCTION {table}_c();""")
        with conn.cursor() as cur:
            holes = ", ".join(["%s"] * (len(columns) + 2))
            cur.executemany(f"INSERT INTO {table} ({', '.join(columns)}, a, b) VALUES ({holes})",
                            [(*make(n), n, f"v{n}") for n in range(1, rows + 1)])
        conn.execute(f"ANALYZE {table}")


class KeyApp(threading.Thread):
    """Writes ``table`` in short transactions over the key slots ``n`` with
    ``n % lanes == lane`` below ``space``: inserts of free keys, updates of
    a and b, key updates to a free key, deletes, and re-inserts of keys it
    deleted. ``oracle``: key -> (a, b) as committed."""

    def __init__(self, url: str, key: tuple[tuple[str, ...], Callable[[int], tuple]],
                 table: str = "items", *, lane: int = 0, lanes: int = 1, space: int = 4000,
                 seed: int = 1) -> None:
        super().__init__(name=f"key-app-{lane}", daemon=True)
        self.url, self.table = url, table
        self.columns, self.make = key
        self.slots = [n for n in range(1, space) if n % lanes == lane]
        self.random = random.Random(seed + lane)
        self.oracle: dict[tuple, tuple[int, str]] = {}
        self.deleted: list[tuple] = []
        self.counts = {"insert": 0, "update": 0, "key_update": 0, "delete": 0, "reinsert": 0}
        self.errors: list[str] = []
        self.longest = 0.0
        self.stop_event = threading.Event()
        self.ops = 0

    def load(self) -> None:
        with psycopg.connect(self.url) as conn:
            cols = ", ".join(self.columns)
            for row in conn.execute(f"SELECT {cols}, a, b FROM {self.table}"):
                key = tuple(row[:len(self.columns)])
                if self._slot(key) in self.slots:
                    self.oracle[key] = (row[-2], row[-1])

    def _slot(self, key: tuple) -> int:
        return int(key[-1])

    @property
    def _match(self) -> str:
        return " AND ".join(f"{c} = %s" for c in self.columns)

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, prepare_threshold=None) as conn:
            while not self.stop_event.is_set():
                try:
                    self._one(conn)
                except psycopg.Error as exc:
                    self.errors.append(str(exc).splitlines()[0])
                self.ops += 1

    def _timed(self, conn: psycopg.Connection, statement: str, params: tuple) -> int:
        started = time.monotonic()
        count = conn.execute(statement, params).rowcount  # type: ignore[arg-type]
        self.longest = max(self.longest, time.monotonic() - started)
        return count

    def _free(self) -> tuple:
        taken = {self._slot(k) for k in self.oracle}
        return self.make(self.random.choice([n for n in self.slots if n not in taken]))

    def _one(self, conn: psycopg.Connection) -> None:
        t, r, n = self.table, self.random, self.random.randrange(1_000_000)
        roll = r.random()
        if roll < 0.1 and self.deleted:
            key = self.deleted.pop(r.randrange(len(self.deleted)))
            if key in self.oracle:
                return
            self._insert(conn, key, n, f"re {n}")
            self.counts["reinsert"] += 1
        elif roll < 0.35 or not self.oracle:
            self._insert(conn, self._free(), n, f"ins {n}")
            self.counts["insert"] += 1
        elif roll < 0.65:
            key = r.choice(list(self.oracle))
            b = f"upd {n}" + "x" * (n % 7)
            self._timed(conn, f"UPDATE {t} SET a = %s, b = %s WHERE {self._match}",
                        (n, b, *key))
            self.oracle[key] = (n, b)
            self.counts["update"] += 1
        elif roll < 0.85:
            key, new = r.choice(list(self.oracle)), self._free()
            sets = ", ".join(f"{c} = %s" for c in self.columns)
            self._timed(conn, f"UPDATE {t} SET {sets}, a = %s WHERE {self._match}",
                        (*new, n, *key))
            self.oracle[new] = (n, self.oracle.pop(key)[1])
            self.deleted.append(key)
            self.counts["key_update"] += 1
        else:
            key = r.choice(list(self.oracle))
            self._timed(conn, f"DELETE FROM {t} WHERE {self._match}", key)
            del self.oracle[key]
            self.deleted.append(key)
            self.counts["delete"] += 1

    def _insert(self, conn: psycopg.Connection, key: tuple, a: int, b: str) -> None:
        holes = ", ".join(["%s"] * (len(key) + 2))
        self._timed(conn, f"INSERT INTO {self.table} ({', '.join(self.columns)}, a, b) "
                          f"VALUES ({holes})", (*key, a, b))
        self.oracle[key] = (a, b)

    def stop(self, at_least_ops: int = 0, timeout: float = 60) -> None:
        target = self.ops + at_least_ops
        deadline = time.monotonic() + timeout
        while self.ops < target and time.monotonic() < deadline and self.is_alive():
            time.sleep(0.01)
        self.stop_event.set()
        self.join(timeout)


def table_as_oracle(url: str, columns: tuple[str, ...], table: str = "items") -> dict:
    """key -> (a, b), and every c equal to length(b) (the user's trigger)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)}, a, b, c FROM {table}").fetchall()
    assert all(r[-1] == len(r[-2]) for r in rows), "a row's c is not length(b)"
    return {tuple(r[:len(columns)]): (r[-3], r[-2]) for r in rows}


# -- the copy -----------------------------------------------------------------------


def split(eng: Engine, plan: Plan, parts: int) -> list[tuple[Key, Key]]:
    """``parts`` ranges of the copy key over T's rows now: from its smallest
    key to its largest + 1 (an integer key) or to END."""
    key, t = plan.copy_key, plan.table
    with eng.begin() as conn:
        count = conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
        cuts = [decode(conn.execute(sa.text(
            f"SELECT {key.read()} FROM {t} ORDER BY {key.order_by()} OFFSET :o LIMIT 1"),
            {"o": count * i // parts}).scalar_one()) for i in range(parts)]
        if key.has_tail:
            last: Key = int(conn.execute(sa.text(f"SELECT max({key.expr()}) FROM {t}"))
                            .scalar_one()) + 1
        else:
            last = END
    return list(zip(cuts, [*cuts[1:], last], strict=True))


def copy_range(eng: Engine, plan: Plan, lo: Key, hi: Key, batch: int) -> int:
    """The copy of one range, batch by batch, each in its own transaction."""
    curr, copied = lo, 0
    while curr != hi:
        with eng.begin() as conn:
            upper, rows = next_bound(conn, plan.table, plan.copy_key, curr, hi, batch)
            run(conn, plan.insert(curr, upper))
        curr, copied = upper, copied + rows
    return copied


def copy_all(eng: Engine, plan: Plan, *, parts: int = 4, threads: int = 2,
             batch: int = 100) -> None:
    ranges = split(eng, plan, parts)
    errors: list[BaseException] = []

    def work(mine: list[tuple[Key, Key]]) -> None:
        try:
            for lo, hi in mine:
                copy_range(eng, plan, lo, hi, batch)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(ranges[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors, errors


def build_all(eng: Engine, plan: Plan) -> None:
    for build in plan.builds:
        with eng.begin() as conn:
            for statement in (*build.statements, *filter(None, [build.validate])):
                run(conn, statement)


def differences(conn: Any, plan: Plan) -> list[tuple]:
    """Rows of T (through the copy's mapping) not in the shadow, and rows of
    the shadow not in T, each marked: [] when the shadow equals T."""
    from_t = plan.select("true")
    columns = ", ".join(f'"{c.name}"' for c in plan.columns)
    from_shadow = f"SELECT {columns} FROM {plan.shadow}"
    missing = run(conn, f"SELECT 'missing', * FROM ({from_t} EXCEPT ALL {from_shadow}) x")
    extra = run(conn, f"SELECT 'extra', * FROM ({from_shadow} EXCEPT ALL {from_t}) x")
    return sorted(missing + extra, key=repr)
