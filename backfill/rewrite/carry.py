"""What the swap carries from T (the source) to the new table (the
target), read from the catalogue before the swap and made again on the
target inside the swap's transaction (DESIGN 15).

Made with the shadow, not here (``shadow``): columns, their types,
defaults, NOT NULL, identity and generation, storage, compression,
statistics targets and attribute options, the table's persistence,
reloptions (table and TOAST), tablespace and access method; its indexes
and CHECK / FOREIGN KEY constraints (the build step, ``builds``).

Carried here: the owner; table and column privileges; comments (table,
columns, indexes, constraints); triggers (with their enabled state:
origin, replica, always, disabled), rules (idem); row level security
(policies, ENABLE / FORCE); replica identity; publications (with PG15
column lists and row filters); sequences owned by a column (OWNED BY moves)
and identity sequences (the target's takes the source's options, position
and name); foreign keys of other tables that reference T (dropped and added
NOT VALID on the referencing table, validated after the swap commits);
views on T (``CREATE OR REPLACE VIEW`` of their own definition, which keeps
their grants, owners, comments and dependants, with their options); CLUSTER
ON; extended statistics. Triggers, rules and policies move: the source keeps
none of them, so a reverse capture writing into it (--keep-old) fires no
trigger of the user's twice, and the source leaves the publications.

Statements are built from definitions read with schema-qualified names
(``qualified``) while T still has its name, and run after the swap's
renames, when that name is the target's: ``public.items`` in a trigger's,
a rule's, a view's or a foreign key's definition then means the target.
What cannot be carried is listed by ``refusals``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite import grants, views
from backfill.rewrite.grants import ROLE
from backfill.rewrite.qualified import qualified_names
from backfill.schema.sql import literal, run
from framework import pgversion
from framework.keys import quote

# A trigger's or a rule's firing state (pg_trigger.tgenabled, pg_rewrite.ev_enabled).
_ENABLE = {"O": "ENABLE", "D": "DISABLE", "R": "ENABLE REPLICA", "A": "ENABLE ALWAYS"}


@dataclass
class Carry:
    """The statements of the swap that carry T's properties, in order."""

    statements: list[str] = field(default_factory=list)
    views: list[views.View] = field(default_factory=list)
    after_commit: list[str] = field(default_factory=list)  # VALIDATE of re-made foreign keys


def read(conn: Connection, source: str, target: str, *, source_after: str,
         target_after: str, target_names: set[str]) -> Carry:
    """The carry from ``source`` to ``target`` (both as named now), for
    statements that run once they are named ``source_after`` and
    ``target_after``. ``target_names``: the target's index and
    constraint names after the swap's renames."""
    with qualified_names(conn):
        carry = Carry()
        columns = _columns(conn, target)
        old, new = source_after, target_after
        add = carry.statements.append
        q = lambda sql: conn.execute(text(sql), {"s": source, "t": target}).all()  # noqa: E731
        owner = q(_OWNER)[0][0]
        add(f"ALTER TABLE {new} OWNER TO {owner}")
        # The owner first: a sequence moves only between tables of its own owner.
        for sequence, column in q(_OWNED_SEQUENCES):
            if column in columns:
                add(f"ALTER SEQUENCE {sequence} OWNED BY {new}.{quote(column)}")
        # The target's identity sequence takes the source's options, position and name.
        targets = {column: (sequence, bare) for column, sequence, bare, _ in
                   conn.execute(text(_IDENTITY_SEQUENCES), {"s": target})}
        for column, sequence, bare, options in q(_IDENTITY_SEQUENCES):
            if column in targets:
                theirs, _ = targets[column]
                add(f"ALTER SEQUENCE {theirs} {options}")
                add(f"SELECT setval({literal(theirs)}, last_value, is_called) FROM {sequence}")
                add(f"ALTER SEQUENCE {sequence} RENAME TO {quote(_retired(sequence))}")
                add(f"ALTER SEQUENCE {theirs} RENAME TO {quote(bare)}")
        _privileges(carry, conn, source, target, new)
        # PostgreSQL 18 on: NOT NULL is a constraint, made by the shadow's LIKE
        # under the source's name; its comment is carried like any other's.
        not_nulls = set(conn.execute(text(_NOT_NULLS), {"t": target}).scalars())
        _comments(carry, conn, source, new, columns, target_names | not_nulls)
        # Triggers and rules move alike: dropped, made again, their firing state set.
        for kind, query in (("TRIGGER", _TRIGGERS), ("RULE", _RULES)):
            for name, definition, enabled, comment in q(query):
                add(f"DROP {kind} {quote(name)} ON {old}")
                add(definition)
                if enabled != "O":
                    add(f"ALTER TABLE {new} {_ENABLE[enabled]} {kind} {quote(name)}")
                _comment(carry, f"{kind} {quote(name)} ON {new}", comment)
        for name, statement, comment in q(_POLICIES):
            add(f"DROP POLICY {quote(name)} ON {old}")
            add(statement.replace(" ON <table>", f" ON {new}", 1))
            _comment(carry, f"POLICY {quote(name)} ON {new}", comment)
        rls, forced, identity, identity_index, cluster = q(_FLAGS)[0]
        if rls:
            add(f"ALTER TABLE {new} ENABLE ROW LEVEL SECURITY")
            add(f"ALTER TABLE {old} DISABLE ROW LEVEL SECURITY")
        if forced:
            add(f"ALTER TABLE {new} FORCE ROW LEVEL SECURITY")
            add(f"ALTER TABLE {old} NO FORCE ROW LEVEL SECURITY")
        if identity == "i":
            add(f"ALTER TABLE {new} REPLICA IDENTITY USING INDEX {quote(identity_index)}")
        elif identity != "d":
            add(f"ALTER TABLE {new} REPLICA IDENTITY {'FULL' if identity == 'f' else 'NOTHING'}")
        publications = _PUBLICATIONS if pgversion.server_major(conn) >= 15 else _PUBLICATIONS_14
        for publication, attributes, where in q(publications):
            listed = f" ({', '.join(quote(a) for a in attributes)})" if attributes else ""
            add(f"ALTER PUBLICATION {quote(publication)} ADD TABLE {new}{listed}"
                + (f" WHERE ({where})" if where else ""))
            add(f"ALTER PUBLICATION {quote(publication)} DROP TABLE {old}")
        for table, name, definition, validated, comment in q(_REFERENCING_FKS):
            add(f"ALTER TABLE {table} DROP CONSTRAINT {quote(name)}")
            add(f"ALTER TABLE {table} ADD CONSTRAINT {quote(name)} "
                f"{definition.removesuffix(' NOT VALID')} NOT VALID")
            _comment(carry, f"CONSTRAINT {quote(name)} ON {table}", comment)
            if validated:
                carry.after_commit.append(
                    f"ALTER TABLE {table} VALIDATE CONSTRAINT {quote(name)}")
        if cluster in target_names:  # (an index the new shape drops takes its mark along)
            add(f"ALTER TABLE {new} CLUSTER ON {quote(cluster)}")
        # The target's own statistics objects go (a revert's target has the
        # source's of before, renamed away), the source's move over.
        for (name,) in conn.execute(text(_STATISTICS_OF), {"s": target}):
            add(f"DROP STATISTICS {name}")
        for name, definition, target_, comment, owner_ in q(_STATISTICS):
            add(f"ALTER STATISTICS {name} RENAME TO {quote(_retired(name))}")
            add(definition)
            if target_ is not None:
                add(f"ALTER STATISTICS {name} SET STATISTICS {target_}")
            _comment(carry, f"STATISTICS {name}", comment)
            add(f"ALTER STATISTICS {name} OWNER TO {owner_}")
        carry.views += [views.View(name, definition, tuple(options or ()))
                        for name, definition, options in q(_VIEWS)]
    return carry


def _retired(qualified: str) -> str:
    """The name an object of the source's is renamed to, making way for the target's."""
    return f"reorg_o_{hashlib.md5(qualified.encode()).hexdigest()[:24]}"


def apply(conn: Connection, carry: Carry) -> None:
    """The carry's statements, then its views, in the caller's transaction."""
    for statement in carry.statements:
        run(conn, statement)
    for view in carry.views:
        views.point_at_new_table(conn, view)


def _columns(conn: Connection, table: str) -> set[str]:
    return set(conn.execute(text("""
        SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0
          AND NOT attisdropped"""), {"t": table}).scalars())


def _comment(carry: Carry, target: str, comment: str | None) -> None:
    if comment is not None:
        carry.statements.append(f"COMMENT ON {target} IS {literal(comment)}")


def _privileges(carry: Carry, conn: Connection, source: str, target: str, new: str) -> None:
    """The target's privileges made the source's, entry by entry (left as
    they are where both have their owner's default privileges only)."""
    me, owner, defaults = conn.execute(text("""
        SELECT quote_ident(current_user), quote_ident(pg_get_userbyid(s.relowner)),
               s.relacl IS NULL AND t.relacl IS NULL
        FROM pg_class s, pg_class t
        WHERE s.oid = to_regclass(:s) AND t.oid = to_regclass(:t)"""),
        {"s": source, "t": target}).one()
    if not defaults:
        held = {g for _, g, _, _ in conn.execute(text(grants.ACL), {"t": target})}
        table = [(grantor, f"GRANT {privilege} ON {new} TO {grantee}", grantable)
                 for grantor, grantee, privilege, grantable in conn.execute(
                     text(grants.ACL), {"t": source})]
        carry.statements += grants.statements(owner, me, grants.revoke_all(new, owner, held),
                                              table)
    columns = [(grantor, f"GRANT {privilege} ({quote(column)}) ON {new} TO {grantee}", grantable)
               for column, grantor, grantee, privilege, grantable in conn.execute(
                   text(_COLUMN_ACL), {"s": source, "t": target})]
    carry.statements += grants.statements(owner, me, [], columns)


def _comments(carry: Carry, conn: Connection, source: str, new: str, columns: set[str],
              target_names: set[str]) -> None:
    schema = new.rsplit(".", 1)[0]
    for kind, name, comment in conn.execute(text(_COMMENTS), {"s": source}):
        if kind == "table":
            _comment(carry, f"TABLE {new}", comment)
        elif kind == "column" and name in columns:
            _comment(carry, f"COLUMN {new}.{quote(name)}", comment)
        elif kind == "index" and name in target_names:
            _comment(carry, f"INDEX {schema}.{quote(name)}", comment)
        elif kind == "constraint" and name in target_names:
            _comment(carry, f"CONSTRAINT {quote(name)} ON {new}", comment)


_NOT_NULLS = """
    SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:t) AND contype = 'n'"""

_OWNER = """
    SELECT quote_ident(pg_get_userbyid(relowner)) FROM pg_class WHERE oid = to_regclass(:s)"""

_COLUMN_ACL = f"""
    SELECT a.attname, {ROLE.format('x.grantor')}, {ROLE.format('x.grantee')},
           x.privilege_type, x.is_grantable
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid, aclexplode(a.attacl) x
    WHERE a.attrelid = to_regclass(:s) AND a.attnum > 0 AND NOT a.attisdropped
      AND EXISTS (SELECT 1 FROM pg_attribute t WHERE t.attrelid = to_regclass(:t)
                  AND t.attname = a.attname AND NOT t.attisdropped)
    ORDER BY x.grantor <> c.relowner, 1, 2, 3, 4"""

_COMMENTS = """
    SELECT 'table', NULL, obj_description(to_regclass(:s), 'pg_class')
    UNION ALL
    SELECT 'column', attname, col_description(attrelid, attnum) FROM pg_attribute
    WHERE attrelid = to_regclass(:s) AND attnum > 0 AND NOT attisdropped
    UNION ALL
    SELECT 'index', ic.relname, obj_description(i.indexrelid, 'pg_class') FROM pg_index i
    JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = to_regclass(:s)
      AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid
                      AND c.conrelid = i.indrelid)
    UNION ALL
    SELECT 'constraint', conname, obj_description(oid, 'pg_constraint') FROM pg_constraint
    WHERE conrelid = to_regclass(:s) AND contype <> 't'"""

_OWNED_SEQUENCES = """
    SELECT format('%I.%I', n.nspname, s.relname), a.attname FROM pg_depend d
    JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
    JOIN pg_namespace n ON n.oid = s.relnamespace
    JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
    WHERE d.classid = 'pg_class'::regclass AND d.refobjid = to_regclass(:s) AND d.deptype = 'a'
    ORDER BY 1"""

_IDENTITY_SEQUENCES = """
    SELECT a.attname, format('%I.%I', n.nspname, s.relname), s.relname,
           format('AS %s INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s %s',
                  format_type(q.seqtypid, NULL), q.seqincrement, q.seqmin, q.seqmax,
                  q.seqstart, q.seqcache, CASE WHEN q.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END)
    FROM pg_depend d
    JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
    JOIN pg_sequence q ON q.seqrelid = s.oid
    JOIN pg_namespace n ON n.oid = s.relnamespace
    JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
    WHERE d.classid = 'pg_class'::regclass AND d.refobjid = to_regclass(:s) AND d.deptype = 'i'
    ORDER BY 1"""

_TRIGGERS = """
    SELECT tgname, pg_get_triggerdef(oid), tgenabled, obj_description(oid, 'pg_trigger')
    FROM pg_trigger WHERE tgrelid = to_regclass(:s) AND NOT tgisinternal
      AND tgname NOT LIKE 'reorg\\_%'
    ORDER BY tgname"""

_RULES = """
    SELECT r.rulename, pg_get_ruledef(r.oid), r.ev_enabled, obj_description(r.oid, 'pg_rewrite')
    FROM pg_rewrite r WHERE r.ev_class = to_regclass(:s) AND r.rulename <> '_RETURN'
    ORDER BY 1"""

_POLICIES = """
    SELECT p.polname,
           format('CREATE POLICY %I ON <table> AS %s FOR %s TO %s', p.polname,
                  CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                  CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT'
                       WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                  (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC'
                                     ELSE quote_ident(pg_get_userbyid(r)) END, ', ' ORDER BY r)
                   FROM unnest(p.polroles) r))
           || coalesce(' USING (' || pg_get_expr(p.polqual, p.polrelid) || ')', '')
           || coalesce(' WITH CHECK (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')', ''),
           obj_description(p.oid, 'pg_policy')
    FROM pg_policy p WHERE p.polrelid = to_regclass(:s) ORDER BY 1"""

_FLAGS = """
    SELECT c.relrowsecurity, c.relforcerowsecurity, c.relreplident,
           (SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
            WHERE i.indrelid = c.oid AND i.indisreplident),
           (SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
            WHERE i.indrelid = c.oid AND i.indisclustered)
    FROM pg_class c WHERE c.oid = to_regclass(:s)"""

_PUBLICATIONS = """
    SELECT p.pubname,
           (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
            WHERE a.attrelid = r.prrelid AND a.attnum = ANY(r.prattrs)),
           pg_get_expr(r.prqual, r.prrelid)
    FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
    WHERE r.prrelid = to_regclass(:s) ORDER BY 1"""

# PostgreSQL 14: a publication has no column list or row filter (prattrs and
# prqual came with 15); it publishes the whole table.
_PUBLICATIONS_14 = """
    SELECT p.pubname, NULL::name[], NULL::text
    FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
    WHERE r.prrelid = to_regclass(:s) ORDER BY 1"""

_REFERENCING_FKS = """
    SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid), c.convalidated,
           obj_description(c.oid, 'pg_constraint')
    FROM pg_constraint c
    WHERE c.contype = 'f' AND c.confrelid = to_regclass(:s) AND c.conrelid <> c.confrelid
      -- a partitioned table's (PostgreSQL 18): its partitions' copies follow it
      AND c.conparentid = 0
    ORDER BY 1, 2"""

# The default target of a statistics object is NULL from PostgreSQL 17 on, -1
# before (stxstattarget became nullable): nullif gives NULL for it on every major.
_STATISTICS = """
    SELECT format('%I.%I', n.nspname, s.stxname), pg_get_statisticsobjdef(s.oid),
           nullif(s.stxstattarget, -1),
           obj_description(s.oid, 'pg_statistic_ext'), quote_ident(pg_get_userbyid(s.stxowner))
    FROM pg_statistic_ext s JOIN pg_namespace n ON n.oid = s.stxnamespace
    WHERE s.stxrelid = to_regclass(:s) ORDER BY 1"""

_STATISTICS_OF = """
    SELECT format('%I.%I', n.nspname, s.stxname)
    FROM pg_statistic_ext s JOIN pg_namespace n ON n.oid = s.stxnamespace
    WHERE s.stxrelid = to_regclass(:s) ORDER BY 1"""

# Views whose query reads T (directly; a view on such a view keeps reading it).
_VIEWS = """
    SELECT DISTINCT format('%I.%I', n.nspname, v.relname), pg_get_viewdef(v.oid),
           v.reloptions
    FROM pg_depend d
    JOIN pg_rewrite r ON r.oid = d.objid
    JOIN pg_class v ON v.oid = r.ev_class AND v.relkind = 'v'
    JOIN pg_namespace n ON n.oid = v.relnamespace
    WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
      AND d.refobjid = to_regclass(:s) AND v.oid <> to_regclass(:s)
    ORDER BY 1"""
