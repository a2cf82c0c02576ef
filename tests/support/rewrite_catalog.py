"""A table with everything a rewrite's swap must carry over (DESIGN 15),
and a snapshot of all of it by name (never by oid), to compare before and
after the swap."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from support.db import ATTOPTIONS, execute


def make_everything(url: str) -> None:
    """Make EVERYTHING in the database at ``url``, with what its server's major adds."""
    execute(url, EVERYTHING)
    major = int(execute(url, "SHOW server_version_num")[0][0]) // 10_000
    execute(url, _PUBLICATION_15 if major >= 15 else _PUBLICATION_14)
    if major >= 18:
        execute(url, _NOT_NULL_18)


# A publication's column list and row filter came with PostgreSQL 15.
_PUBLICATION_15 = """CREATE PUBLICATION pub_some FOR TABLE items (id, a, b) WHERE (a > 10)
                     WITH (publish = 'insert')"""
_PUBLICATION_14 = "CREATE PUBLICATION pub_some FOR TABLE items WITH (publish = 'insert')"
# PostgreSQL 18 makes NOT NULL a constraint with a name and a comment.
_NOT_NULL_18 = """ALTER TABLE items RENAME CONSTRAINT items_a_not_null TO items_a_present;
                  COMMENT ON CONSTRAINT items_a_present ON items IS 'always an a'"""

EVERYTHING = """
    DO $$ DECLARE r text; BEGIN
        FOREACH r IN ARRAY ARRAY['r_owner', 'r_reader', 'r_writer', 'r_sub'] LOOP
            BEGIN EXECUTE format('CREATE ROLE %I', r);
            EXCEPTION WHEN duplicate_object THEN NULL; END;
        END LOOP; END $$;
    CREATE TABLE parent (code text PRIMARY KEY);
    INSERT INTO parent VALUES ('x'), ('y');
    CREATE TABLE items (
        id serial PRIMARY KEY,
        n int GENERATED ALWAYS AS IDENTITY (START 100 INCREMENT 2 CACHE 5) UNIQUE,
        a int NOT NULL DEFAULT 3 CONSTRAINT items_a_check CHECK (a > -1000),
        b text REFERENCES parent,
        c numeric(10, 2) DEFAULT 1.5,
        e text,
        up int REFERENCES items (id),
        g int GENERATED ALWAYS AS (a * 2) STORED
    ) WITH (fillfactor = 85, toast.autovacuum_enabled = false);
    ALTER TABLE items ALTER COLUMN a SET STATISTICS 250, ALTER COLUMN b SET (n_distinct = 2);
    CREATE INDEX items_e_idx ON items (lower(e)) WHERE e IS NOT NULL;
    CREATE INDEX items_c_idx ON items (c DESC);
    INSERT INTO items (a, b, e) SELECT g, CASE WHEN g % 2 = 0 THEN 'x' ELSE 'y' END, 'e' || g
        FROM generate_series(1, 400) g;
    ALTER TABLE items OWNER TO r_owner;
    REVOKE TRUNCATE ON items FROM r_owner;
    GRANT SELECT ON items TO r_reader;
    GRANT INSERT, UPDATE ON items TO r_writer WITH GRANT OPTION;
    SET ROLE r_writer; GRANT INSERT ON items TO r_sub; RESET ROLE;
    GRANT SELECT (a, b) ON items TO r_sub;
    GRANT UPDATE (e) ON items TO r_reader WITH GRANT OPTION;
    COMMENT ON TABLE items IS 'the items';
    COMMENT ON COLUMN items.a IS 'column a';
    COMMENT ON INDEX items_e_idx IS 'lower e';
    COMMENT ON CONSTRAINT items_pkey ON items IS 'the key';
    COMMENT ON CONSTRAINT items_a_check ON items IS 'a is big enough';
    CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN NEW.e := coalesce(NEW.e, 'touched'); RETURN NEW; END $$;
    CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
    CREATE TRIGGER t_origin BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION touch();
    CREATE TRIGGER t_disabled AFTER UPDATE OF a ON items FOR EACH ROW
        WHEN (OLD.a IS DISTINCT FROM NEW.a) EXECUTE FUNCTION noop();
    ALTER TABLE items DISABLE TRIGGER t_disabled;
    CREATE TRIGGER t_replica AFTER DELETE ON items FOR EACH ROW EXECUTE FUNCTION noop();
    ALTER TABLE items ENABLE REPLICA TRIGGER t_replica;
    CREATE TRIGGER t_always AFTER INSERT ON items REFERENCING NEW TABLE AS added
        FOR EACH STATEMENT EXECUTE FUNCTION noop();
    ALTER TABLE items ENABLE ALWAYS TRIGGER t_always;
    CREATE CONSTRAINT TRIGGER t_deferred AFTER INSERT ON items DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION noop();
    COMMENT ON TRIGGER t_origin ON items IS 'fills e';
    CREATE POLICY p_read ON items AS PERMISSIVE FOR SELECT TO r_reader, r_sub USING (a > 0);
    CREATE POLICY p_change ON items AS RESTRICTIVE FOR UPDATE USING (true)
        WITH CHECK (b IS NOT NULL);
    COMMENT ON POLICY p_read ON items IS 'readers see positives';
    ALTER TABLE items ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
    ALTER TABLE items REPLICA IDENTITY USING INDEX items_n_key;
    CREATE PUBLICATION pub_all FOR TABLE items;
    CREATE TABLE child (id int PRIMARY KEY, item_id int REFERENCES items (id) ON DELETE CASCADE);
    INSERT INTO child SELECT g, g FROM generate_series(1, 50) g;
    COMMENT ON CONSTRAINT child_item_id_fkey ON child IS 'child of items';
    CREATE TABLE loose (item_id int);
    ALTER TABLE loose ADD CONSTRAINT loose_item FOREIGN KEY (item_id) REFERENCES items (id)
        NOT VALID;
    CREATE VIEW v_plain AS SELECT id, a, b FROM items WHERE a > 5;
    CREATE VIEW v_opts WITH (security_barrier) AS SELECT id, a FROM items WHERE a < 300
        WITH CASCADED CHECK OPTION;
    CREATE VIEW v_on_view AS SELECT id FROM v_plain;
    ALTER VIEW v_opts OWNER TO r_reader;
    GRANT SELECT ON v_plain TO r_sub;
    COMMENT ON VIEW v_plain IS 'a plain view';
    COMMENT ON COLUMN v_plain.a IS 'a of the view';
    ALTER TABLE items CLUSTER ON items_c_idx;
    CREATE STATISTICS items_ab_stats (ndistinct, dependencies) ON a, b FROM items;
    ALTER STATISTICS items_ab_stats SET STATISTICS 300;
    ALTER STATISTICS items_ab_stats OWNER TO r_owner;
    COMMENT ON STATISTICS items_ab_stats IS 'a and b go together';
    CREATE RULE items_keep_negative AS ON DELETE TO items WHERE OLD.a < -500 DO INSTEAD NOTHING;
    CREATE RULE items_disabled_rule AS ON UPDATE TO items WHERE NEW.a = -999 DO INSTEAD NOTHING;
    ALTER TABLE items DISABLE RULE items_disabled_rule;
    COMMENT ON RULE items_keep_negative ON items IS 'negatives stay';
    UPDATE items SET up = id - 1 WHERE id > 1;
    ANALYZE items;
"""

_ROLE = "CASE WHEN {0} = 0 THEN 'PUBLIC' ELSE pg_get_userbyid({0}) END"
_ACL = (f"(SELECT array_agg(format('%s>%s:%s:%s', {_ROLE.format('x.grantor')}, "
        f"{_ROLE.format('x.grantee')}, x.privilege_type, x.is_grantable) ORDER BY 1) "
        "FROM aclexplode({0}) x)")


def snapshot(conn: sa.Connection, table: str = "public.items") -> dict[str, Any]:
    """Everything DESIGN 15 names, by name."""
    def q(sql: str) -> list:
        return sorted(tuple(r) for r in conn.execute(sa.text(sql), {"t": table}))

    # PostgreSQL 14 has no column lists or row filters (prattrs, prqual).
    publication_parts = ("""ARRAY(SELECT a.attname FROM pg_attribute a
                                  WHERE a.attrelid = r.prrelid AND a.attnum = ANY(r.prattrs)
                                  ORDER BY a.attnum),
                            pg_get_expr(r.prqual, r.prrelid)"""
                         if conn.dialect.server_version_info >= (15,) else "NULL, NULL")

    return {
        "table": q(f"""
            SELECT pg_get_userbyid(c.relowner), {_ACL.format(
                "coalesce(c.relacl, acldefault('r', c.relowner))")},
                   c.relrowsecurity, c.relforcerowsecurity, c.relreplident, c.reloptions,
                   t.reloptions, c.relpersistence, obj_description(c.oid, 'pg_class')
            FROM pg_class c LEFT JOIN pg_class t ON t.oid = c.reltoastrelid
            WHERE c.oid = to_regclass(:t)"""),
        "columns": q(f"""
            SELECT attname, format_type(atttypid, atttypmod), attnotnull, attidentity,
                   attgenerated, attstattarget, {ATTOPTIONS}, attstorage,
                   pg_get_expr(d.adbin, d.adrelid), col_description(attrelid, attnum),
                   {_ACL.format('a.attacl')}
            FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid
                 AND d.adnum = a.attnum
            WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped"""),
        "indexes": q("""
            SELECT ic.relname, pg_get_indexdef(i.indexrelid), i.indisclustered,
                   i.indisreplident, i.indisvalid, obj_description(i.indexrelid, 'pg_class')
            FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
            WHERE i.indrelid = to_regclass(:t)"""),
        "constraints": q("""
            SELECT conname, contype, pg_get_constraintdef(oid), convalidated, condeferrable,
                   condeferred, obj_description(oid, 'pg_constraint')
            FROM pg_constraint WHERE conrelid = to_regclass(:t)"""),
        "referencing": q("""
            SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), convalidated,
                   obj_description(oid, 'pg_constraint')
            FROM pg_constraint WHERE confrelid = to_regclass(:t) AND conrelid <> confrelid"""),
        "triggers": q("""
            SELECT tgname, pg_get_triggerdef(oid), tgenabled, tgdeferrable, tginitdeferred,
                   obj_description(oid, 'pg_trigger')
            FROM pg_trigger WHERE tgrelid = to_regclass(:t) AND NOT tgisinternal"""),
        "policies": q("""
            SELECT polname, polcmd, polpermissive,
                   ARRAY(SELECT CASE WHEN r = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(r) END
                         FROM unnest(polroles) r ORDER BY 1),
                   pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid),
                   obj_description(oid, 'pg_policy')
            FROM pg_policy WHERE polrelid = to_regclass(:t)"""),
        "rules": q("""
            SELECT rulename, pg_get_ruledef(oid), ev_enabled, obj_description(oid, 'pg_rewrite')
            FROM pg_rewrite WHERE ev_class = to_regclass(:t)"""),
        "publications": q(f"""
            SELECT p.pubname, {publication_parts}
            FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
            WHERE r.prrelid = to_regclass(:t)"""),
        "sequences": q("""
            SELECT s.relname, a.attname, d.deptype, format_type(q.seqtypid, NULL), q.seqstart,
                   q.seqincrement, q.seqmin, q.seqmax, q.seqcache, q.seqcycle,
                   pg_sequence_last_value(s.oid), pg_get_userbyid(s.relowner)
            FROM pg_depend d JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
            JOIN pg_sequence q ON q.seqrelid = s.oid
            JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
            WHERE d.refobjid = to_regclass(:t) AND d.deptype IN ('a', 'i')"""),
        "views": q(f"""
            SELECT v.relname, pg_get_viewdef(v.oid), v.reloptions, pg_get_userbyid(v.relowner),
                   {_ACL.format('v.relacl')}, obj_description(v.oid, 'pg_class'),
                   ARRAY(SELECT col_description(v.oid, attnum) FROM pg_attribute
                         WHERE attrelid = v.oid AND attnum > 0 ORDER BY attnum)
            FROM pg_class v WHERE v.relkind = 'v' AND v.relnamespace = 'public'::regnamespace"""),
        "statistics": q("""
            SELECT stxname, pg_get_statisticsobjdef(oid), stxstattarget,
                   pg_get_userbyid(stxowner), obj_description(oid, 'pg_statistic_ext')
            FROM pg_statistic_ext WHERE stxrelid = to_regclass(:t)"""),
    }
