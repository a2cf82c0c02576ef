"""What ``alter-type`` carries over (DESIGN 15), against what a plain
``ALTER TABLE ... ALTER COLUMN ... TYPE`` does: the same table is built in
two schemas, the plain ALTER runs on one and the job on the other (with an
application writing it the whole time), and the two catalogues must be
equal, compared by name (a column's position aside: the job's column moves
to the end, as the README says). What a plain ALTER refuses, the job
refuses too, in one line. And the sequence a ``serial`` column owns is
widened with the column (a plain ALTER leaves it ``AS integer``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support import scalar, wait_state
from support.app import App, table_as_oracle
from support.db import ATTOPTIONS

from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 2_000

# Every property of the table, of the column and of what covers it that a
# plain ALTER ... TYPE keeps (written for whichever schema is first on the
# search_path; {ts} is a tablespace, {pub} a publication of that schema,
# {nulls_not_distinct} what PostgreSQL 15 on has of it).
TABLE = """
    DO $$ BEGIN CREATE ROLE app_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
    DO $$ BEGIN CREATE ROLE app_owner; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
    CREATE TABLE ref (id bigint PRIMARY KEY);
    INSERT INTO ref SELECT generate_series(0, 96);
    CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL DEFAULT 7, b text, c text)
        WITH (fillfactor = 90);
    ALTER TABLE items ADD CONSTRAINT items_a_check CHECK (a >= 0),
        ADD CONSTRAINT items_a_small CHECK (a < 100000) NOT VALID,
        ADD CONSTRAINT items_a_fkey FOREIGN KEY (a) REFERENCES ref (id) ON DELETE CASCADE,
        ADD CONSTRAINT items_a_b_key UNIQUE (a, b) DEFERRABLE INITIALLY DEFERRED;
    COMMENT ON CONSTRAINT items_a_b_key ON items IS 'one b per a';
    COMMENT ON CONSTRAINT items_a_check ON items IS 'never negative';
    COMMENT ON CONSTRAINT items_a_fkey ON items IS 'a known a';
    CREATE UNIQUE INDEX items_id_a ON items (id, a) WITH (fillfactor = 70) TABLESPACE {ts};
    ALTER TABLE items REPLICA IDENTITY USING INDEX items_id_a;
    CREATE INDEX items_a_part ON items (a) INCLUDE (b) WHERE a > 3;
    CREATE UNIQUE INDEX items_b_a ON items (b COLLATE "C" text_pattern_ops, a DESC NULLS LAST)
        {nulls_not_distinct};
    CREATE INDEX items_expr ON items ((a + 1), lower(b));
    ALTER INDEX items_expr ALTER COLUMN 1 SET STATISTICS 300;
    ALTER TABLE items CLUSTER ON items_expr;
    COMMENT ON INDEX items_expr IS 'by a + 1';
    COMMENT ON COLUMN items.a IS 'the a';
    COMMENT ON TABLE items IS 'the items';
    GRANT SELECT ON items TO app_reader;
    GRANT SELECT (id, a), UPDATE (a) ON items TO app_reader;
    GRANT INSERT (a) ON items TO app_reader WITH GRANT OPTION;
    ALTER TABLE items ALTER COLUMN a SET STATISTICS 500, ALTER COLUMN a SET (n_distinct = 97);
    ALTER TABLE items ENABLE ROW LEVEL SECURITY;
    CREATE POLICY items_b ON items USING (b IS NOT NULL);
    CREATE PUBLICATION {pub} FOR TABLE items;
    ALTER TABLE items OWNER TO app_owner;
    INSERT INTO items (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {rows}) g;
    ANALYZE items;
"""


@pytest.fixture
def tablespace(settings) -> Iterator[str]:
    """A tablespace inside the server's data directory (a developer option of
    PostgreSQL 15: no directory to hand to the server's user, here or in a
    container), emptied of this test's indexes and dropped afterwards."""
    name = f"reorg_ts_{uuid.uuid4().hex[:8]}"
    url = settings.database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET allow_in_place_tablespaces = on")
        conn.execute(f"CREATE TABLESPACE {name} LOCATION ''")
    try:
        yield name
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER INDEX ALL IN TABLESPACE {name} SET TABLESPACE pg_default")
            conn.execute(f"DROP TABLESPACE {name}")


def _build(url: str, schema: str, tablespace: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path = {schema}")
        nulls_not_distinct = "NULLS NOT DISTINCT" if conn.info.server_version >= 150000 else ""
        conn.execute(TABLE.format(ts=tablespace, pub=f"pub_{schema}", rows=ROWS,
                                  nulls_not_distinct=nulls_not_distinct))
        if conn.info.server_version >= 180000:
            # PostgreSQL 18 makes NOT NULL a constraint with a name and a
            # comment, which a plain ALTER ... TYPE keeps (the job renames its own).
            conn.execute("ALTER TABLE items RENAME CONSTRAINT items_a_not_null TO items_a_present;"
                         "COMMENT ON CONSTRAINT items_a_present ON items IS 'always an a'")


def carried(url: str, schema: str) -> dict[str, Any]:
    """Everything of ``schema``.items that a change of a column's type could
    lose, by name (never by attnum or oid), read with the schema on the
    search_path so both schemas print alike."""
    with psycopg.connect(url) as conn:
        conn.execute(f"SET search_path = {schema}")
        t = "items"

        def q(sql: str) -> list[tuple]:
            # pg_get_indexdef names the table with its schema whatever the search_path.
            return sorted(tuple(v.replace(f" ON {schema}.", " ON ") if isinstance(v, str) else v
                                for v in r) for r in conn.execute(sql, {"t": t}).fetchall())

        acl = """(SELECT array_agg(format('%%s>%%s:%%s:%%s', pg_get_userbyid(g.grantor),
                          CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(g.grantee)
                          END, g.privilege_type, g.is_grantable) ORDER BY 1)
                  FROM aclexplode({}) g)"""
        return {
            "table": q(f"""
                SELECT relreplident, reloptions, pg_get_userbyid(relowner), relrowsecurity,
                       relforcerowsecurity, relpersistence, reltablespace,
                       obj_description(oid, 'pg_class'), {acl.format('relacl')}
                FROM pg_class WHERE oid = %(t)s::regclass"""),
            "columns": q(f"""
                SELECT attname, format_type(atttypid, atttypmod), attnotnull,
                       pg_get_expr(d.adbin, d.adrelid), col_description(attrelid, attnum),
                       attstattarget, {ATTOPTIONS}, attcollation::regcollation::text, attstorage,
                       attcompression, attidentity, attgenerated, {acl.format('attacl')}
                FROM pg_attribute a LEFT JOIN pg_attrdef d
                  ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                WHERE attrelid = %(t)s::regclass AND attnum > 0 AND NOT attisdropped"""),
            "indexes": q("""
                SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary,
                       i.indisunique, i.indimmediate, i.indisvalid, i.indisclustered,
                       i.indisreplident, c.reloptions,
                       (SELECT spcname FROM pg_tablespace WHERE oid = c.reltablespace),
                       obj_description(i.indexrelid, 'pg_class'),
                       -- the default target: -1 before PostgreSQL 17, NULL from 17 on
                       ARRAY(SELECT coalesce(attstattarget, -1) FROM pg_attribute
                             WHERE attrelid = i.indexrelid ORDER BY attnum)
                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                WHERE i.indrelid = %(t)s::regclass"""),
            "constraints": q("""
                SELECT conname, contype, pg_get_constraintdef(oid), convalidated,
                       condeferrable, condeferred, connoinherit,
                       obj_description(oid, 'pg_constraint')
                FROM pg_constraint WHERE conrelid = %(t)s::regclass"""),
            "sequences": q(f"""
                SELECT s.relname, a.attname, format_type(q.seqtypid, NULL), q.seqmin, q.seqmax,
                       q.seqincrement, q.seqcache, q.seqcycle, {acl.format('s.relacl')}
                FROM pg_depend d
                JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
                JOIN pg_sequence q ON q.seqrelid = s.oid
                JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.refobjid = %(t)s::regclass AND d.deptype = 'a'"""),
            "triggers": q("""SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger
                             WHERE tgrelid = %(t)s::regclass AND NOT tgisinternal"""),
            "policies": q("""SELECT polname, pg_get_expr(polqual, polrelid) FROM pg_policy
                             WHERE polrelid = %(t)s::regclass"""),
            # (column lists and row filters came with PostgreSQL 15)
            "publications": q(f"""
                SELECT replace(pubname, '_{schema}', ''),
                       {"ARRAY(SELECT unnest(attnames) ORDER BY 1), rowfilter"
                        if conn.info.server_version >= 150000 else "NULL, NULL"}
                FROM pg_publication_tables WHERE schemaname = '{schema}'
                  AND tablename = %(t)s"""),
            "statistics": q("""SELECT stxname, pg_get_statisticsobjdef(oid) FROM pg_statistic_ext
                               WHERE stxrelid = %(t)s::regclass"""),
        }


def _index_statistics(facts: dict[str, Any]) -> dict[str, Any]:
    return {row[0]: row[-1] for row in facts["indexes"]}


def test_every_property_a_plain_alter_type_keeps_is_kept(
        tablespace, db, settings, start_node):
    url = settings.database_url
    _build(url, "plain", tablespace)
    _build(url, "public", tablespace)
    before = carried(url, "public")
    assert carried(url, "plain") == before
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE plain.items ALTER COLUMN a TYPE bigint")
    plain = carried(url, "plain")
    # The table is published and has REPLICA IDENTITY USING INDEX on the
    # column: an UPDATE or DELETE after a cut-over that lost it fails.
    app = App(url, value=lambda n: n % 97)
    app.load()
    app.start()
    job_id = submit(db, SubmitRequest(
        "alter-type", {"table": "public.items", "column": "a", "type": "bigint"},
        rows_per_subtask=500, batch_rows=200)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=50)  # writes after the cut-over too
    assert done["state"] == "succeeded", done
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    reorg = carried(url, "public")
    # An index's statistics target (ALTER INDEX ... ALTER COLUMN n SET
    # STATISTICS) is kept by the job; PostgreSQL 15's plain ALTER drops it
    # with the index it rebuilds.
    assert _index_statistics(reorg) == _index_statistics(before)
    assert _index_statistics(plain)["items_expr"] == [-1, -1]
    for facts in (reorg, plain):
        facts["indexes"] = [row[:-1] for row in facts["indexes"]]
    for part in plain:
        assert reorg[part] == plain[part], part


@pytest.mark.parametrize(("publication", "plain_says"), [
    ("FOR TABLE items (id, a, b)", "cannot alter type of a column used by a publication"),
    ("FOR TABLE items WHERE (a > 0)", "cannot alter type of a column used by a publication"),
], ids=["column list", "row filter"])
def test_a_publication_naming_the_column_is_refused_as_a_plain_alter_refuses_it(
        db, settings, publication, plain_says, pg_major):
    """PostgreSQL 15 refuses to change (or drop) a column a publication's
    column list or row filter names: so does the job, at submit, by name."""
    if pg_major < 15:
        pytest.skip("publications have column lists and row filters from PostgreSQL 15 on")
    url = settings.database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL, b text);"
                     f"CREATE PUBLICATION pub_a {publication}")
        with pytest.raises(psycopg.Error, match=plain_says):
            conn.execute("ALTER TABLE items ALTER COLUMN a TYPE bigint")
    with pytest.raises(InvalidParams) as refused:
        submit(db, SubmitRequest("alter-type", {"table": "items", "column": "a",
                                                "type": "bigint"}))
    message = str(refused.value)
    assert "publication of table items in publication pub_a" in message, message
    assert "\n" not in message
    assert scalar(db, "SELECT count(*) FROM {s}.jobs") == 0


@pytest.mark.parametrize("kind", ["ALWAYS", "BY DEFAULT"])
def test_int_to_bigint_keeps_the_identity_its_sequence_and_its_value(
        db, settings, start_node, kind):
    """The identity's sequence goes with the old column: the cut-over makes
    it again on the new one, same kind, name and settings, at the value the
    old one had (no key handed out twice), widened to bigint's range."""
    url = settings.database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE items (id int GENERATED {kind} AS IDENTITY "
                     "(START WITH 10 INCREMENT BY 3 CACHE 2) PRIMARY KEY, a int NOT NULL, b text);"
                     "INSERT INTO items (a, b) SELECT g, 'v' || g FROM generate_series(1, 500) g")
    plan = submit(db, _alter_id(dry_run=True)).notes
    assert any(f"ADD GENERATED {kind} AS IDENTITY (SEQUENCE NAME public.items_id_seq "
               "INCREMENT BY 3" in line for line in plan), plan
    app = App(url)
    app.load()
    app.start()
    job_id = submit(db, _alter_id(rows_per_subtask=250)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    app.stop(at_least_ops=20)
    assert done["state"] == "succeeded", done
    assert app.errors == [] and table_as_oracle(url) == app.oracle
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT attidentity, format_type(atttypid, NULL) FROM pg_attribute "
            "WHERE attrelid = 'items'::regclass AND attname = 'id'").fetchone() == (
            "a" if kind == "ALWAYS" else "d", "bigint")
        assert conn.execute("SELECT pg_get_serial_sequence('items', 'id')").fetchone() == (
            "public.items_id_seq",)
        assert conn.execute("SELECT seqstart, seqincrement, seqcache, seqmin FROM pg_sequence "
                            "WHERE seqrelid = 'items_id_seq'::regclass").fetchone() == (10, 3, 2, 1)
        assert _sequence(url) == ("bigint", 9_223_372_036_854_775_807)
        top = conn.execute("SELECT max(id) FROM items").fetchone()[0]
        [(after,)] = conn.execute("INSERT INTO items (a, b) VALUES (1, 'after') "
                                  "RETURNING id").fetchall()
        assert after > top and (after - 10) % 3 == 0, (after, top)
        conn.execute("SELECT setval('items_id_seq', 2147483646)")
        keys = [conn.execute("INSERT INTO items (a, b) VALUES (1, 'past') RETURNING id")
                .fetchone()[0] for _ in range(3)]
    assert keys == [2_147_483_649, 2_147_483_652, 2_147_483_655]


def _sequence(url: str) -> tuple:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT format_type(seqtypid, NULL), seqmax FROM pg_sequence "
                            "WHERE seqrelid = 'items_id_seq'::regclass").fetchone()


def _serial_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL, b text);"
                     "INSERT INTO items (a, b) SELECT g, 'v' || g FROM generate_series(1, 500) g")


def _alter_id(**knobs: Any) -> SubmitRequest:
    return SubmitRequest("alter-type", {"table": "items", "column": "id", "type": "bigint"},
                         **knobs)


def test_the_dry_run_shows_the_serial_sequence_widened(db, settings):
    url = settings.database_url
    _serial_table(url)
    plan = submit(db, _alter_id(dry_run=True)).notes
    assert any('ALTER SEQUENCE public.items_id_seq AS bigint' in line for line in plan), plan
    assert _sequence(url) == ("integer", 2_147_483_647)  # a dry run changes nothing


def test_int_to_bigint_widens_the_serial_sequence_so_keys_go_past_the_int_max(
        db, settings, start_node):
    url = settings.database_url
    _serial_table(url)
    request = _alter_id(rows_per_subtask=250)
    app = App(url)
    app.load()
    app.start()
    job_id = submit(db, request).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    app.stop(at_least_ops=20)
    assert done["state"] == "succeeded", done
    assert app.errors == [] and table_as_oracle(url) == app.oracle
    assert _sequence(url) == ("bigint", 9_223_372_036_854_775_807)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT setval('items_id_seq', 2147483646)")
        keys = [conn.execute("INSERT INTO items (a, b) VALUES (1, 'past') RETURNING id")
                .fetchone()[0] for _ in range(3)]
    assert keys == [2_147_483_647, 2_147_483_648, 2_147_483_649]
