"""Alembic: one head, a data-keeping downgrade/upgrade round trip, a clear
refusal when behind; and the SQL split against its pure oracle."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from support import make_items

from framework import migrate
from framework.config import Settings
from framework.db import Database, SchemaBehind
from framework.splitting import boundaries_of, plan_split, ranges_from_boundaries


def test_migrations_have_a_single_head_and_dated_files():
    script = ScriptDirectory.from_config(migrate.alembic_config("reorg"))
    assert len(script.get_heads()) == 1
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


def test_two_installations_in_two_schemas_share_a_database(migrated_db):
    other = Database(Settings(migrated_db, schema="reorg_b"))
    migrate.upgrade(other)
    other.check_schema_current()
    Database(Settings(migrated_db)).check_schema_current()
    other.dispose()


@pytest.mark.parametrize("step,per", [(1, 100), (13, 7), (1, 5000)])
def test_sql_split_matches_the_pure_oracle_and_is_deterministic(db, step, per):
    make_items(db, 1_000, step=step)
    with db.begin() as conn:
        keys = list(conn.execute(sa.text("SELECT id FROM items ORDER BY id")).scalars())
        plan = plan_split(conn, '"public"."items"', '"id"', per)
        again = plan_split(conn, '"public"."items"', '"id"', per)
    assert plan == again and plan.row_count == 1_000
    assert plan.ranges == ranges_from_boundaries(boundaries_of(keys, per), keys[-1])


def test_split_of_an_empty_table_has_no_ranges(db):
    make_items(db, 0)
    with db.begin() as conn:
        assert plan_split(conn, '"public"."items"', '"id"').ranges == []
