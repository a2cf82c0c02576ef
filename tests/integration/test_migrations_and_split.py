"""Alembic: one head with dated, reasoned files; install, downgrade to base
(which drops every table) and install again; a downgrade of one revision and
back keeps the rows (for each revision above the first); a clear refusal when
behind. And the SQL split against its pure oracle."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from support import make_items

from framework import migrate, revisions
from framework.config import Settings
from framework.db import Database, SchemaBehind
from framework.keyset_split import plan_split
from framework.splitting import boundaries_of, ranges_from_boundaries

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog


def test_migrations_have_a_single_head_and_dated_files():
    script = ScriptDirectory.from_config(migrate.alembic_config("reorg"))
    assert len(script.get_heads()) == 1
    # Commands check against the head read off the files, without alembic.
    assert revisions.head_revision() == migrate.alembic_head() == script.get_heads()[0]
    for rev in script.walk_revisions():
        assert rev.doc and "Why:" in (rev.module.__doc__ or ""), f"{rev.revision} says no why"


def test_round_trip_keeps_a_fresh_install_working(fresh_db):
    db = Database(Settings(fresh_db, schema="reorg_rt"))
    with pytest.raises(SchemaBehind, match="reorg db upgrade"):
        db.check_schema_current()
    migrate.upgrade(db)
    db.check_schema_current()
    migrate.downgrade(db, "base")
    with pytest.raises(SchemaBehind, match="not installed|at revision None"):
        db.check_schema_current()
    migrate.upgrade(db)
    with db.begin() as conn:
        conn.execute(db.sql("INSERT INTO {s}.jobs (type, params, target_table, key_column) "
                            "VALUES ('t', '{}', 'x', 'id')"))
        assert conn.execute(db.sql("SELECT revision FROM {s}.owner_lease")).scalar() == 0
    db.dispose()


def _steps_above_the_first() -> list:
    script = ScriptDirectory.from_config(migrate.alembic_config("reorg"))
    steps = [pytest.param(rev.down_revision, rev.revision, id=rev.revision)
             for rev in script.walk_revisions() if isinstance(rev.down_revision, str)]
    return steps or [pytest.param(None, None, marks=pytest.mark.skip(
        reason="one revision only: below it is base, where no table and no row is left"))]


@pytest.mark.parametrize("below, revision", _steps_above_the_first())
def test_a_downgrade_of_one_revision_and_back_keeps_the_rows(fresh_db, below, revision):
    db = Database(Settings(fresh_db, schema="reorg_rt"))
    migrate.upgrade(db, revision)
    with db.begin() as conn:
        conn.execute(db.sql("""
            INSERT INTO {s}.jobs (id, type, params, target_table, key_column, state)
            OVERRIDING SYSTEM VALUE VALUES (7, 't', '{"set": "c=1"}', 'x', 'id', 'running')"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key, row_count)
            VALUES (1, 7, 1, 1, 'running', '0', '10', '5', 5)"""))  # keys: bigint or jsonb
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask_history
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key, row_count)
            VALUES (2, 7, 1, 2, 'succeeded', '10', '20', '20', 10)"""))

    def rows() -> list:
        with db.begin() as conn:
            return [
                list(conn.execute(db.sql("SELECT id, type, params, state FROM {s}.jobs"))),
                list(conn.execute(db.sql(
                    "SELECT id, job_id, state, curr_key, row_count FROM {s}.background_subtask"))),
                list(conn.execute(db.sql(
                    "SELECT id, job_id, state, curr_key, row_count "
                    "FROM {s}.background_subtask_history")))]

    before = rows()
    migrate.downgrade(db, below)
    migrate.upgrade(db, revision)
    assert rows() == before
    db.dispose()


def test_two_installations_in_two_schemas_share_a_database(migrated_db):
    other = Database(Settings(migrated_db, schema="reorg_b"))
    migrate.upgrade(other)
    other.check_schema_current()
    Database(Settings(migrated_db)).check_schema_current()
    other.dispose()


# per >= splitting.WALK_MIN_ROWS_PER_RANGE walks the index; below, numbered keys.
@pytest.mark.parametrize("rows,step,per", [(1_000, 1, 100), (1_000, 13, 7), (1_000, 1, 5000),
                                           (5_500, 3, 1_000), (4_000, 1, 1_000)])
def test_sql_split_matches_the_pure_oracle_and_is_deterministic(db, rows, step, per):
    make_items(db, rows, step=step)
    with db.begin() as conn:
        keys = list(conn.execute(sa.text("SELECT id FROM items ORDER BY id")).scalars())
        plan = plan_split(conn, '"public"."items"', '"id"', per)
        again = plan_split(conn, '"public"."items"', '"id"', per)
    assert plan == again and plan.row_count == rows
    assert plan.ranges == ranges_from_boundaries(boundaries_of(keys, per), keys[-1])


@pytest.mark.parametrize("per", [7, 1_000])
def test_split_of_a_tail_starts_at_its_from_key(db, per):
    make_items(db, 3_000, step=2)
    with db.begin() as conn:
        keys = list(conn.execute(sa.text("SELECT id FROM items WHERE id >= 1001 "
                                         "ORDER BY id")).scalars())
        plan = plan_split(conn, '"public"."items"', '"id"', per, from_key=1000)
    assert plan.row_count == len(keys)
    expected = ranges_from_boundaries([1000, *boundaries_of(keys, per)[1:]], keys[-1])
    assert plan.ranges == expected


def test_split_of_an_empty_table_has_no_ranges(db):
    make_items(db, 0)
    with db.begin() as conn:
        assert plan_split(conn, '"public"."items"', '"id"').ranges == []


def test_upgrade_to_0002_counts_what_earlier_jobs_already_moved(fresh_db):
    db = Database(Settings(fresh_db, schema="reorg_0002"))
    migrate.upgrade(db, "0001")
    with db.begin() as conn:
        conn.execute(db.sql("""
            INSERT INTO {s}.jobs (id, type, params, target_table, key_column, state)
            OVERRIDING SYSTEM VALUE VALUES (1, 't', '{}', 'x', 'id', 'succeeded'),
                                           (2, 't', '{}', 'y', 'id', 'running')"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask_history
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key, row_count)
            SELECT g, 1, 1, g, CASE WHEN g <= 3 THEN 'succeeded' ELSE 'cancelled' END,
                   g * 10, g * 10 + 10, g * 10 + 10, 7 FROM generate_series(1, 5) g"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key)
            VALUES (10, 2, 1, 0, 'pending', 0, 10, 0)"""))
    migrate.upgrade(db)
    with db.begin() as conn:
        rows = conn.execute(db.sql("""
            SELECT id, subtasks_total, moved_succeeded, moved_cancelled, moved_rows, history_done
            FROM {s}.jobs ORDER BY id""")).all()
    assert [tuple(r) for r in rows] == [(1, 5, 3, 2, 35, True), (2, 1, 0, 0, 0, False)]
    migrate.downgrade(db, "0001")  # and back: the columns go, the rows stay
    with db.begin() as conn:
        assert conn.execute(db.sql("SELECT count(*) FROM {s}.jobs")).scalar() == 2
    db.dispose()


def test_a_big_table_is_split_from_a_sample_into_even_ranges_that_tile_its_keys(db):
    make_items(db, 300_000, step=3)
    with db.begin() as conn:
        conn.execute(sa.text("ANALYZE items"))
    with db.begin(isolation_level="REPEATABLE READ") as conn:
        plan = plan_split(conn, '"public"."items"', '"id"', 10_000, exact_max_rows=0)
        again = plan_split(conn, '"public"."items"', '"id"', 10_000, exact_max_rows=0)
        counts = [conn.execute(sa.text("SELECT count(*) FROM items WHERE id >= :lo AND id < :hi"),
                               {"lo": lo, "hi": hi}).scalar() for lo, hi in plan.ranges]
    assert plan.ranges == again.ranges  # deterministic (DESIGN 5)
    assert plan.ranges[0][0] == 1 and plan.ranges[-1][1] == 1 + 3 * 299_999 + 1
    assert all(a[1] == b[0] for a, b in zip(plan.ranges, plan.ranges[1:], strict=False))
    assert sum(counts) == 300_000  # every row in exactly one range
    assert 25 <= len(plan.ranges) <= 35 and max(counts) <= 1.5 * 10_000, counts
    assert abs(plan.row_count - 300_000) < 30_000  # the estimate, not a count
