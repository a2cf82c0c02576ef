"""One key abstraction (``framework.keys.KeySpec``): the SQL builders are
written once, and the key renders what differs between a single integer key
and any other. Each rendering is checked on PostgreSQL against the bound
forms the rest of the job uses: the same rows for the same keys, on keys
of every kind, including text keys that carry quotes and backslashes
written into a statement as literals (under either setting of
``standard_conforming_strings``)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from framework.keys import END, KeySpec, decode

# kind -> (column definitions, key columns, their types, SQL of row i's key)
KINDS = {
    "bigint": ("k bigint PRIMARY KEY", ("k",), ("bigint",), "i * 3"),
    "integer": ("k integer PRIMARY KEY", ("k",), ("integer",), "i * 3 - 100"),
    "text": ("k text PRIMARY KEY", ("k",), ("text",),
             "CASE i % 4 WHEN 0 THEN 'it''s ' WHEN 1 THEN 'a\\b ' WHEN 2 THEN '\"q\" ' "
             "ELSE 'é ' END || md5(i::text)"),
    "numeric": ("k numeric(12, 4) PRIMARY KEY", ("k",), ("numeric(12,4)",),
                "round((i - 150) / 7.0, 4)"),
    "composite": ("region text, n integer, PRIMARY KEY (region, n)", ("region", "n"),
                  ("text", "integer"), "(ARRAY['e''u', 'u\\s', 'ap'])[i % 3 + 1], i / 3"),
}
ROWS = 300


def make_table(conn, kind: str) -> tuple[KeySpec, list]:
    columns, names, types, key_sql = KINDS[kind]
    conn.execute(sa.text("DROP TABLE IF EXISTS t"))
    conn.execute(sa.text(f"CREATE TABLE t ({columns}, v bigint)"))
    conn.execute(sa.text(f"INSERT INTO t ({', '.join(names)}, v) "
                         f"SELECT {key_sql}, i FROM generate_series(1, {ROWS}) i"))
    key = KeySpec.of(names, types)
    keys = [decode(k) for k in conn.execute(sa.text(
        f"SELECT {key.read()} FROM t ORDER BY {key.order_by()}")).scalars()]
    return key, keys


def values(conn, key: KeySpec, where: str, params: dict | None = None) -> list:
    return list(conn.execute(sa.text(
        f"SELECT v FROM t WHERE {where} ORDER BY {key.order_by()}"), params or {}).scalars())


@pytest.mark.parametrize("conforming", ["on", "off"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_rendering_of_a_key_selects_what_its_bound_form_selects(db, kind, conforming):
    with db.begin() as conn:
        key, keys = make_table(conn, kind)
        conn.execute(sa.text(f"SET LOCAL standard_conforming_strings = {conforming}"))
        assert key.arithmetic == (kind in ("bigint", "integer"))
        for lo, hi in [(keys[0], keys[50]), (keys[17], keys[18]), (keys[120], keys[-1]),
                       (keys[200], END)]:
            bounded = hi is not END
            bound = values(conn, key, key.in_range(None, bounded=bounded),
                           {"lo": key.bind(lo), "hi": key.bind(hi)})
            assert bound, (lo, hi)
            # Written into the statement: what alter-type's batches and
            # Spark's partition predicates send.
            assert values(conn, key, key.between(lo, hi)) == bound
            # The n-th key past lo: where a batch ends.
            n = len(bound) // 2
            nth = conn.execute(sa.text(
                f"SELECT {key.read_nth('t', key.in_range(None, bounded=bounded), ':n')}"),
                {"lo": key.bind(lo), "hi": key.bind(hi), "n": n}).scalar()
            assert decode(nth) == keys[keys.index(lo) + n]
        listed = keys[3:300:37]
        # A list of keys: a bound list (merge's lock, checksum's confirmation)
        # and the same written into a statement (Spark's re-read).
        by_bind = [decode(k) for k in conn.execute(sa.text(
            f"SELECT {key.read()} FROM t WHERE {key.among('keys')} ORDER BY {key.order_by()}"),
            {"keys": key.bind_all(listed)}).scalars()]
        by_literal = [decode(k) for k in conn.execute(sa.text(
            f"SELECT {key.read()} FROM t WHERE {key.among_literal(listed)} "
            f"ORDER BY {key.order_by()}")).scalars()]
        assert by_bind == by_literal == listed


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_work_table_keyed_like_the_users_table_holds_its_keys_and_bounds(db, kind):
    """``work_key``: the layout of before-images, owned keys, copied keys and
    a batch's stage (``k`` for a single integer key, as jobs in flight have
    it); ``bound_type``/``bound_param``: a batch's bounds in such a table."""
    with db.begin() as conn:
        key, keys = make_table(conn, kind)
        work = key.work_key()
        assert work.columns == (("k",) if key.arithmetic
                                else tuple(f"k{i}" for i in range(len(key.columns))))
        cols = ", ".join(f"{c} {t} NOT NULL" for c, t in zip(work.columns, work.types,
                                                               strict=True))
        conn.execute(sa.text(f"CREATE TEMP TABLE w ({cols}, lo {key.bound_type}, "
                             f"hi {key.bound_type}) ON COMMIT DROP"))
        conn.execute(sa.text(f"INSERT INTO w SELECT {key.order_by()}, "
                             f"{key.bound_param('lo')}, {key.bound_param('hi')} FROM t"),
                     {"lo": key.bind(keys[0]), "hi": key.bind(keys[-1])})
        joined = conn.execute(sa.text(
            f"SELECT count(*) FROM t JOIN w ON {key.expr('t')} = {work.expr('w')} "
            f"WHERE {work.in_range('w')}"), {"lo": key.bind(keys[10]),
                                             "hi": key.bind(keys[20])}).scalar_one()
        assert joined == 10
        lo, hi = conn.execute(sa.text(
            f"SELECT CAST({'to_jsonb(lo)' if key.arithmetic else 'lo'} AS text), "
            f"CAST({'to_jsonb(hi)' if key.arithmetic else 'hi'} AS text) "
            "FROM w LIMIT 1")).one()
        assert (decode(lo), decode(hi)) == (keys[0], keys[-1])
        # A stored key made of values, read back as the key's typed value.
        stored = key.stored_of(work.names("w"))
        assert conn.execute(sa.text(
            f"SELECT count(*) FROM w WHERE {key.from_stored(stored)} = {work.expr('w')}"
        )).scalar_one() == ROWS


def test_two_keys_match_when_their_rows_can_be_matched_on_them():
    bigint, integer = KeySpec.of(["id"], ["bigint"]), KeySpec.of(["id"], ["integer"])
    text, pair = KeySpec.of(["id"], ["text"]), KeySpec.of(["r", "n"], ["text", "integer"])
    assert bigint.matches(integer) and integer.matches(bigint)
    assert pair.matches(KeySpec.of(["r", "n"], ["text", "integer"]))
    assert not text.matches(bigint) and not bigint.matches(text)
    assert not pair.matches(KeySpec.of(["r", "n"], ["text", "bigint"]))
