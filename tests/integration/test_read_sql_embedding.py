"""The SQL text Spark's JDBC source runs for backfill and copy (issue 11): a
user's ``--where`` pasted into it keeps its place, even when it ends in a
``--`` comment, and the extra condition after it still applies. Runs the text
on PostgreSQL directly; no Spark."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import make_items

from backfill.copy.batches import CopySpec
from backfill.expressions import one_expression
from backfill.spark.jdbc import read_query
from framework.keys import KeySpec

WHERES = ["a = 1 -- only ones", "a = 1 /* only ones */", "(a = 1)", "a = 1\n-- only ones"]


def ids(db, source_sql):
    with db.begin() as conn:
        return [r[0] for r in conn.execute(sa.text(f"SELECT id FROM {source_sql} ORDER BY id"))]


@pytest.mark.parametrize("where", WHERES)
def test_backfill_read_keeps_the_predicate_and_the_key_condition(db, where):
    make_items(db, 1_000)
    where = one_expression(where, "--where")
    assert ids(db, read_query('"public"."items"', where, "id < 300")) == [
        k for k in range(1, 300) if k % 97 == 1]
    assert ids(db, read_query('"public"."items"', where, limit=2)) == [1, 98]


@pytest.mark.parametrize("where", WHERES)
def test_copy_read_keeps_the_predicate(db, where):
    make_items(db, 1_000)
    spec = CopySpec(1, '"public"."items"', '"id"', "id", '"public"."t"', (),
                    one_expression(where, "--where"), True, "reorg",
                    source_key=KeySpec.of(["id"], ["bigint"]))
    assert ids(db, spec.base_query(limit=3)) == [1, 98, 195]
