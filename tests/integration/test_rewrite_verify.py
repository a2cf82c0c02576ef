"""The verify's comparison (``backfill.rewrite.verify.compare``) on real
PostgreSQL: what it counts as differing, and what it leaves to the replay
(a key in the change log), on an integer key, a composite text key and a
copy ranged over --order-by columns (where the log, keyed by T's key, is
not ranged). Its results are checked against the same sums computed in
Python from the rows themselves."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support.rewrite import BIGINT, COMPOSITE, build_all, copy_all, engine, make_table

from backfill.rewrite import shadow
from backfill.rewrite.capture import Capture
from backfill.rewrite.verify import compare
from backfill.schema.sql import run
from framework.keys import END

JOB = 43
ROWS = 300


def prepared(url: str, request: shadow.Request) -> Capture:
    eng = engine(url)
    with eng.begin() as conn:
        run(conn, "CREATE SCHEMA IF NOT EXISTS reorg")
        # what --order-by a needs: a NOT NULL column an index starts with
        run(conn, "ALTER TABLE items ALTER COLUMN a SET NOT NULL")
        run(conn, "CREATE INDEX items_a ON items (a, id)")
        plan = shadow.plan(conn, "items", JOB, request)
        capture = Capture(plan, "reorg")
        for statement in (*plan.create, *capture.install()):
            run(conn, statement)
    copy_all(eng, plan, parts=3, threads=2, batch=70)
    build_all(eng, plan)
    with eng.begin() as conn:
        run(conn, f"DELETE FROM {capture.log}")  # the copy's own writes: none; start clean
    return capture


@pytest.mark.parametrize(("key", "request_"), [
    (BIGINT, shadow.Request()),
    (COMPOSITE, shadow.Request()),
    (BIGINT, shadow.Request(order_by=("a",))),
], ids=["bigint", "composite", "order-by"])
def test_compare_leaves_logged_keys_out_and_finds_every_other_difference(fresh_db, key,
                                                                        request_):
    make_table(fresh_db, key, ROWS)
    capture = prepared(fresh_db, request_)
    plan, eng = capture.plan, engine(fresh_db)
    columns = ", ".join(key[0])
    lo, hi = None, END  # every row
    with eng.begin() as conn:
        same = compare(conn, plan, capture, lo, hi)
        assert not same.differs and (same.rows, same.logged, same.scanned) == (ROWS, 0, ROWS)
        # Keys 5, 6 and 7 written by an application (logged): T's rows 5 and
        # 6 changed, 7 deleted, not replayed yet; left out on both sides.
        run(conn, f"INSERT INTO {capture.log} ({', '.join(capture.log_key.names())}) "
                  f"SELECT {columns} FROM items WHERE a IN (5, 6, 7, 6)")
        run(conn, "UPDATE items SET b = 'new' WHERE a IN (5, 6)")
        run(conn, "DELETE FROM items WHERE a = 7")
        left_out = compare(conn, plan, capture, lo, hi)
        assert not left_out.differs, left_out.described()
        assert (left_out.rows, left_out.logged, left_out.scanned) == (ROWS - 3, 2, ROWS - 1)
        # The same sums in Python, from T's rows not in the log.
        unlogged = conn.execute(sa.text(
            f"SELECT count(*) FROM items WHERE ({columns}) NOT IN "
            f"(SELECT {', '.join(capture.log_key.names())} FROM {capture.log})")).scalar()
        assert left_out.rows == unlogged
        # A shadow row gone wrong whose key is not in the log is found.
        run(conn, f"UPDATE {plan.shadow} SET b = 'wrong' WHERE a = 200")
        wrong = compare(conn, plan, capture, lo, hi)
        assert wrong.differs and wrong.rows == ROWS - 3
        assert wrong.described().endswith("their contents differ")
        # ... and a row gone from the shadow.
        run(conn, f"UPDATE {plan.shadow} SET b = 'v200' WHERE a = 200")
        run(conn, f"DELETE FROM {plan.shadow} WHERE a = 201")
        gone = compare(conn, plan, capture, lo, hi)
        assert gone.differs and gone.described() == (
            f"{ROWS - 3} rows in T, {ROWS - 4} in the shadow")
        # Every key of T logged: no row left to compare, on either side.
        run(conn, f"INSERT INTO {capture.log} ({', '.join(capture.log_key.names())}) "
                  f"SELECT {columns} FROM items")
        run(conn, f"INSERT INTO {capture.log} ({', '.join(capture.log_key.names())}) "
                  f"SELECT {columns} FROM {plan.shadow}")
        none = compare(conn, plan, capture, lo, hi)
        assert not none.differs and (none.rows, none.checksum) == (0, "")
