"""Keys of any type (framework.keys): tables keyed by text, uuid, numeric, a
timestamp, several columns or a unique NOT NULL index are split into ranges
that tile the whole key space (DESIGN 5, a property test over each kind),
run by ``sql-update`` batch by batch with keyset bounds, and rolled back
exactly (the Spark types on such keys: test_spark_any_key.py); job types that
need one integer column refuse such tables in one line, and so does a table
with no usable key."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import TERMINAL, wait_state

from backfill.tables import inspect_table
from framework import faults, jobtype
from framework.errors import InvalidParams
from framework.keys import END, KeySpec, decode
from framework.keyset_split import plan_split
from framework.owner import Owner
from framework.records import Target
from framework.store import history, subtasks
from framework.submit import SubmitRequest, submit

# kind -> (column definitions and key, the SQL of row i's key columns)
KINDS = {
    "text": ("k text PRIMARY KEY", ("k",), ("text",),
             "CASE WHEN i % 3 = 0 THEN upper(md5(i::text)) ELSE 'k é ' || md5(i::text) END"),
    "uuid": ("k uuid PRIMARY KEY", ("k",), ("uuid",), "md5(i::text)::uuid"),
    "numeric": ("k numeric(12, 4) PRIMARY KEY", ("k",), ("numeric(12,4)",),
                "round((i - 1500) / 7.0, 4)"),
    "timestamptz": ("k timestamptz PRIMARY KEY", ("k",), ("timestamp with time zone",),
                    "timestamptz '2026-01-01 00:00:00+00' + i * interval '1.000001 second'"),
    "composite": ("region text, n integer, PRIMARY KEY (region, n)", ("region", "n"),
                  ("text", "integer"), "(ARRAY['eu', 'us', 'ap'])[i % 3 + 1], i / 3"),
    "unique-not-null": ("code varchar(40) NOT NULL UNIQUE", ("code",),
                        ("character varying(40)",), "'c' || (i * 7919 % 10007)"),
}


def run(db, sql, **params):
    with db.begin() as conn:
        return conn.execute(sa.text(sql), params)


def make_table(db, kind: str, rows: int, name: str = "t") -> KeySpec:
    columns, names, types, key_sql = KINDS[kind]
    run(db, f"DROP TABLE IF EXISTS {name}")
    run(db, f"CREATE TABLE {name} ({columns}, v bigint)")
    run(db, f"INSERT INTO {name} ({', '.join(names)}, v) "
            f"SELECT {key_sql}, i FROM generate_series(1, {rows}) i")
    run(db, f"ANALYZE {name}")
    return KeySpec.of(names, types)


def assert_ranges_tile_the_table(db, table: str, key: KeySpec, ranges) -> None:
    """Every range starts where the one before ended, the first at the
    smallest key, the last at END; each row lies in exactly one range."""
    assert ranges, "no ranges"
    assert ranges[-1][1] is END
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    with db.begin() as conn:
        total = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
        first = conn.execute(sa.text(
            f"SELECT {key.read()} FROM {table} ORDER BY {key.order_by()} LIMIT 1")).scalar()
        assert ranges[0][0] == decode(first)
        counts = [conn.execute(
            sa.text(f"SELECT count(*) FROM {table} WHERE "
                    f"{key.in_range(None, bounded=hi is not END)}"),
            {"lo": key.bind(lo), "hi": key.bind(hi)}).scalar_one() for lo, hi in ranges]
    assert sum(counts) == total  # ranges are disjoint and ordered: each row once
    assert all(c > 0 for c in counts[:-1]) or total == 0


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("per, exact_max_rows", [(1_000, 10**9), (7, 10**9), (250, 0)],
                         ids=["walked", "numbered", "sampled"])
def test_ranges_of_every_key_kind_tile_the_key_space(db, kind, per, exact_max_rows):
    key = make_table(db, kind, 3_000)
    with db.begin() as conn:
        plan = plan_split(conn, '"public"."t"', key, per, exact_max_rows=exact_max_rows)
        again = plan_split(conn, '"public"."t"', key, per, exact_max_rows=exact_max_rows)
    assert plan == again  # deterministic (DESIGN 5)
    assert_ranges_tile_the_table(db, "t", key, plan.ranges)
    if exact_max_rows:
        assert plan.row_count == 3_000
        assert len(plan.ranges) == -(-3_000 // per)


text_keys = st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
                             max_size=6), min_size=1, max_size=60, unique=True)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=text_keys, per=st.integers(min_value=1, max_value=12))
def test_any_set_of_text_keys_is_tiled_in_the_databases_own_order(db, keys, per):
    """Property: whatever the strings (case, accents, spaces, symbols), the
    ranges follow PostgreSQL's collation, not Python's string order."""
    run(db, "DROP TABLE IF EXISTS p")
    run(db, "CREATE TABLE p (k text PRIMARY KEY, v int)")
    with db.begin() as conn:
        conn.execute(sa.text("INSERT INTO p VALUES (:k, 0)"), [{"k": k} for k in keys])
    key = KeySpec.of(["k"], ["text"])
    with db.begin() as conn:
        plan = plan_split(conn, '"public"."p"', key, per)
    assert_ranges_tile_the_table(db, "p", key, plan.ranges)


# kind -> (column type, strategy of its Python values)
VALUE_KINDS = {
    "uuid": ("uuid", st.uuids()),
    "numeric": ("numeric(14,4)", st.decimals(min_value=-10**6, max_value=10**6, places=4,
                                             allow_nan=False, allow_infinity=False)),
    "timestamptz": ("timestamptz", st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC))),
    "date": ("date", st.dates(min_value=date(1, 1, 1))),
}


@pytest.mark.parametrize("kind", list(VALUE_KINDS))
def test_any_set_of_keys_of_each_kind_is_tiled(db, kind):
    """Property, per key kind: ranges cut exactly (walked or numbered) or
    from a sample tile whatever set of keys the table holds."""
    column_type, values = VALUE_KINDS[kind]
    key = KeySpec.of(["k"], [column_type])

    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(keys=st.lists(values, min_size=1, max_size=60, unique=True),
           per=st.integers(min_value=1, max_value=12), sampled=st.booleans())
    def tiled(keys, per, sampled):
        run(db, "DROP TABLE IF EXISTS p")
        run(db, f"CREATE TABLE p (k {column_type} PRIMARY KEY, v int)")
        with db.begin() as conn:
            conn.execute(sa.text("INSERT INTO p VALUES (:k, 0) ON CONFLICT DO NOTHING"),
                         [{"k": k} for k in keys])
        run(db, "ANALYZE p")
        with db.begin() as conn:
            plan = plan_split(conn, '"public"."p"', key, per,
                              exact_max_rows=0 if sampled else 10**9)
        assert_ranges_tile_the_table(db, "p", key, plan.ranges)

    tiled()


composite_keys = st.lists(st.tuples(st.sampled_from(["a", "B", "b", "ä", ""]),
                                    st.integers(-50, 50)), min_size=1, max_size=60, unique=True)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=composite_keys, per=st.integers(min_value=1, max_value=12))
def test_any_set_of_composite_keys_is_tiled(db, keys, per):
    run(db, "DROP TABLE IF EXISTS p")
    run(db, "CREATE TABLE p (a text, b int, v int, PRIMARY KEY (a, b))")
    with db.begin() as conn:
        conn.execute(sa.text("INSERT INTO p VALUES (:a, :b, 0)"),
                     [{"a": a, "b": b} for a, b in keys])
    key = KeySpec.of(["a", "b"], ["text", "integer"])
    with db.begin() as conn:
        plan = plan_split(conn, '"public"."p"', key, per)
    assert_ranges_tile_the_table(db, "p", key, plan.ranges)


@pytest.mark.parametrize("kind", list(KINDS))
def test_sql_update_sets_every_row_once_on_any_key(db, start_node, kind):
    make_table(db, kind, 2_000)
    job_id = submit(db, SubmitRequest("sql-update", {"table": "t", "set": "v=v*2+1"},
                                      rows_per_subtask=300, batch_rows=70)).job_id
    start_node("n1", slots=2)
    job = wait_state(db, job_id, TERMINAL, 90)
    assert job["state"] == "succeeded", job
    assert run(db, "SELECT count(*) FROM t WHERE v <> (v - 1) / 2 * 2 + 1 "
                   "OR v IS NULL").scalar_one() == 0
    assert sorted(run(db, "SELECT (v - 1) / 2 FROM t").scalars()) == list(range(1, 2_001))
    with db.begin() as conn:
        subtasks = history.subtasks_of_job(db, conn, job_id)
    # Every row counted once (no batch applied twice), every range to its end.
    assert sum(s["row_count"] for s in subtasks) == 2_000
    assert all(s["curr_key"] == s["end_key"] for s in subtasks)


@pytest.mark.parametrize("kind", ["text", "composite"])
def test_a_failed_sql_update_on_any_key_is_rolled_back_exactly(db, start_node, kind):
    make_table(db, kind, 2_000)
    run(db, "UPDATE t SET v = NULL WHERE v % 10 = 0")  # NULL old values come back too
    before = sorted(map(tuple, run(db, "SELECT * FROM t").all()), key=repr)
    faults.arm("worker.before_checkpoint", "raise@9")  # fails the job after 8 batches
    job_id = submit(db, SubmitRequest("sql-update", {"table": "t", "set": "v=coalesce(v, 0)-1"},
                                      rows_per_subtask=500, batch_rows=100)).job_id
    start_node("n1", slots=1, max_attempts=1)
    assert wait_state(db, job_id, TERMINAL, 90)["state"] == "reverted"
    assert sorted(map(tuple, run(db, "SELECT * FROM t").all()), key=repr) == before


def test_add_column_fills_a_table_keyed_by_several_columns(db, start_node):
    make_table(db, "composite", 1_500)
    job_id = submit(db, SubmitRequest("add-column", {
        "table": "t", "column": "w:text", "value": "region || '-' || n", "not_null": True},
        rows_per_subtask=400, batch_rows=90)).job_id
    start_node("n1", slots=2)
    assert wait_state(db, job_id, TERMINAL, 90)["state"] == "succeeded"
    assert run(db, "SELECT count(*) FROM t WHERE w = region || '-' || n").scalar_one() == 1_500
    assert run(db, "SELECT attnotnull FROM pg_attribute WHERE attrelid = 't'::regclass "
                   "AND attname = 'w'").scalar_one() is True


@pytest.mark.parametrize("ddl, message", [
    ("CREATE TABLE t (a int, v int)",
     "table public.t has no primary key and no unique index on NOT NULL columns; "
     "reorg needs one to split the table into ranges (e.g. ALTER TABLE ... ADD PRIMARY KEY)"),
    ("CREATE TABLE t (a int UNIQUE, v int)",
     "table public.t has no primary key and no unique index on NOT NULL columns; "
     "reorg needs one to split the table into ranges (e.g. ALTER TABLE ... ADD PRIMARY KEY)"),
    ("CREATE TABLE t (a float8 PRIMARY KEY, v int)",
     "table public.t is keyed by a double precision; reorg cannot range over a key column of "
     "type double precision (keys may be integers, numeric, text, varchar, uuid, date, "
     "timestamps or booleans)"),
    ('CREATE TABLE t (a text COLLATE "C" PRIMARY KEY, v int)',
     "table public.t is keyed by a text with a collation other than the database's default; "
     "reorg orders text keys in the default collation"),
])
def test_a_table_without_a_usable_key_is_refused_in_one_line(db, ddl, message):
    run(db, ddl)
    with pytest.raises(InvalidParams) as refused:
        submit(db, SubmitRequest("sql-update", {"table": "t", "set": "v=1"}))
    assert str(refused.value) == message
    assert run(db, "SELECT count(*) FROM reorg.jobs").scalar_one() == 0


class _IntegerKeyedType(jobtype.JobType):
    """A job type that names its table's key but never said it takes keys of
    any type (no ``keys_of_any_type``): its SQL may do key arithmetic."""

    name = "test-integer-keyed"

    def validate(self, conn, params):
        table = inspect_table(conn, params["table"], any_key=True)
        return Target(table.qualified, table.key_sql, dict(params), key=table.key_spec)

    prepare = advance = plan_revert = revert = None  # never reached: refused at submit


def test_a_job_type_that_takes_only_integer_keys_is_refused_by_the_framework(db):
    """Every built-in type takes keys of any type; one from another package
    that does not say so is refused at submit, in one line, before any row."""
    make_table(db, "composite", 10)
    jobtype.register(_IntegerKeyedType())
    with pytest.raises(InvalidParams) as refused:
        submit(db, SubmitRequest("test-integer-keyed", {"table": "t"}))
    assert str(refused.value) == (
        "test-integer-keyed runs only on tables keyed by one integer column (smallint, integer "
        "or bigint); public.t is keyed by (region text, n integer); use a job type that takes "
        "keys of any type (e.g. sql-update)")
    assert run(db, "SELECT count(*) FROM reorg.jobs").scalar_one() == 0


def test_numeric_keys_of_many_digits_are_split_and_resumed_exactly(db, start_node):
    """A float has 15-17 significant digits; these keys differ in the 25th.
    Cut and checkpointed through floats, two keys would share a bound and a
    row would be skipped or done twice (DESIGN 5)."""
    run(db, "CREATE TABLE t (k numeric(40, 20) PRIMARY KEY, v bigint)")
    run(db, "INSERT INTO t SELECT 12345.678901234567890123 + i * 1e-18, i "
            "FROM generate_series(1, 1000) i")
    key = KeySpec.of(["k"], ["numeric(40,20)"])
    with db.begin() as conn:
        plan = plan_split(conn, '"public"."t"', key, 7)
    assert_ranges_tile_the_table(db, "t", key, plan.ranges)
    assert len(plan.ranges) == -(-1_000 // 7)
    job_id = submit(db, SubmitRequest("sql-update", {"table": "t", "set": "v=-v"},
                                      rows_per_subtask=100, batch_rows=9)).job_id
    start_node("n1", slots=2)
    assert wait_state(db, job_id, TERMINAL, 90)["state"] == "succeeded"
    assert sorted(run(db, "SELECT -v FROM t").scalars()) == list(range(1, 1_001))


def test_a_checkpoint_of_a_key_of_any_type_never_moves_backward(db):
    """DESIGN 6 for array keys: the checkpoint's forward-only test compares
    stored jsonb keys, and the last range's END finishes the subtask."""
    make_table(db, "composite", 30)
    submit(db, SubmitRequest("sql-update", {"table": "t", "set": "v=1"}, rows_per_subtask=100))
    owner = Owner(db, "o")
    claims: list = []
    for _ in range(5):  # elect, prepare and split: a few ticks
        owner.tick()
        with db.begin() as conn:
            claims = subtasks.claim(db, conn, "w1")
        if claims:
            break
    claim, = claims
    assert claim.start_key == ("ap", 0) and claim.end_key is END
    with db.begin() as conn:
        assert subtasks.checkpoint_one(db, conn, claim, ("eu", 1), 5).state == "running"
        assert not subtasks.checkpoint_one(db, conn, claim, ("ap", 3), 1)  # backward
        assert subtasks.checkpoint_one(db, conn, claim, END, 25).state == "succeeded"
