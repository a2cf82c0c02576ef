"""What the catalogue says about one column of a table: its own facts (type,
NOT NULL, default, comment, sequences it owns, its identity), its settings (privileges
granted on it, statistics target, attribute options), the indexes and constraints
that cover it, and the objects that depend on it which a column swap cannot
carry over (views, foreign keys of other tables, triggers, policies, ...)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

# A column's options as its owner set them (ALTER COLUMN ... SET (...)), from
# pg_attribute.attoptions. PostgreSQL 15.20 as Debian ships it also keeps a
# stamp of the server's there, ``pg_attver=<the LSN of the column's last
# definition>``, which SET ignores and every ALTER of the column renews: no
# option to carry over or to compare.
USER_ATTOPTIONS = ("ARRAY(SELECT o FROM unnest(attoptions) o "
                   "WHERE NOT starts_with(o, 'pg_attver='))")


@dataclass(frozen=True)
class ColumnFacts:
    name: str
    attnum: int
    type: str  # format_type, e.g. integer, numeric(10,2)
    not_null: bool
    default: str | None  # pg_get_expr of the default, as \d shows it
    comment: str | None
    identity: bool
    generated: bool
    owned_sequences: tuple[str, ...]  # schema-qualified, quoted
    # PostgreSQL 18 on: NOT NULL is a constraint of its own in pg_constraint
    # (contype 'n'), with a name and a comment; None before 18.
    not_null_constraint: str | None = None
    not_null_comment: str | None = None
    not_null_valid: bool = True  # 18 on: NOT NULL ... NOT VALID leaves it False


@dataclass(frozen=True)
class IdentityFacts:
    """An identity column's sequence, as ``ADD GENERATED ... AS IDENTITY``
    takes it again: the sequence goes with its column, so a swap of columns
    re-creates it on the new one."""

    kind: str  # ALWAYS or BY DEFAULT
    sequence: str  # schema-qualified, quoted
    increment: int
    start: int
    cache: int
    cycle: bool
    # None where it is the default of the sequence's type (NO MINVALUE /
    # NO MAXVALUE): on a wider new type it becomes the wider type's default,
    # as a plain ALTER TABLE ... TYPE makes it; a value the user set stays.
    minimum: int | None
    maximum: int | None
    last_value: int
    is_called: bool

    def options(self) -> str:
        return (f"SEQUENCE NAME {self.sequence} INCREMENT BY {self.increment} "
                f"{_bound('MINVALUE', self.minimum)} {_bound('MAXVALUE', self.maximum)} "
                f"START WITH {self.start} CACHE {self.cache} {'' if self.cycle else 'NO '}CYCLE")


def _bound(word: str, value: int | None) -> str:
    return f"NO {word}" if value is None else f"{word} {value}"


@dataclass(frozen=True)
class ColumnGrant:
    privilege: str  # SELECT, INSERT, UPDATE or REFERENCES
    grantee: str  # a quoted role name, or PUBLIC
    grantable: bool  # WITH GRANT OPTION

    def on(self, table: str, column: str) -> str:
        """The GRANT of this privilege on ``column`` (both quoted)."""
        option = " WITH GRANT OPTION" if self.grantable else ""
        return f"GRANT {self.privilege} ({column}) ON {table} TO {self.grantee}{option}"


@dataclass(frozen=True)
class ColumnSettings:
    """What ``GRANT``/``ALTER TABLE`` set on the column itself."""

    grants: tuple[ColumnGrant, ...]
    statistics: int | None  # SET STATISTICS; None: the default
    options: tuple[str, ...]  # attoptions, e.g. "n_distinct=97"


@dataclass(frozen=True)
class IndexFacts:
    """An index that covers the column (as a key, in an expression or its predicate)."""

    name: str  # unquoted
    definition: str  # pg_get_indexdef
    valid: bool
    comment: str | None
    # The PRIMARY KEY or UNIQUE constraint the index backs, if any.
    constraint: str | None
    constraint_type: str | None  # 'p', 'u' or 'x'
    deferrable: bool
    deferred: bool
    constraint_comment: str | None
    tablespace: str | None  # unquoted; None: the database's default
    clustered: bool  # ALTER TABLE ... CLUSTER ON
    replica_identity: bool  # REPLICA IDENTITY USING INDEX
    # ALTER INDEX ... ALTER COLUMN n SET STATISTICS: (n, target) of each column set.
    statistics: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ConstraintFacts:
    """A CHECK or FOREIGN KEY constraint of the table that uses the column."""

    name: str
    type: str  # 'c' or 'f'
    definition: str  # pg_get_constraintdef
    validated: bool
    comment: str | None


def table_oid(conn: Connection, table: str) -> int | None:
    return conn.execute(text("SELECT to_regclass(:t)::oid"), {"t": table}).scalar()


def column_facts(conn: Connection, table: str, column: str) -> ColumnFacts | None:
    row = conn.execute(text("""
        SELECT a.attnum, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid) AS default_expr,
               col_description(a.attrelid, a.attnum) AS comment,
               a.attidentity <> '' AS identity, a.attgenerated <> '' AS generated,
               nn.conname AS not_null_constraint,
               obj_description(nn.oid, 'pg_constraint') AS not_null_comment,
               coalesce(nn.convalidated, true) AS not_null_valid
        FROM pg_attribute a
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        -- no row before PostgreSQL 18, which records NOT NULL in pg_constraint
        LEFT JOIN pg_constraint nn ON nn.conrelid = a.attrelid AND nn.contype = 'n'
             AND nn.conkey = ARRAY[a.attnum]
        WHERE a.attrelid = to_regclass(:t) AND a.attname = :c AND a.attnum > 0
          AND NOT a.attisdropped"""), {"t": table, "c": column}).first()
    if row is None:
        return None
    sequences = conn.execute(text("""
        SELECT format('%I.%I', n.nspname, s.relname) FROM pg_depend dep
        JOIN pg_class s ON s.oid = dep.objid AND s.relkind = 'S'
        JOIN pg_namespace n ON n.oid = s.relnamespace
        WHERE dep.classid = 'pg_class'::regclass AND dep.refclassid = 'pg_class'::regclass
          AND dep.refobjid = to_regclass(:t) AND dep.refobjsubid = :n AND dep.deptype = 'a'
        ORDER BY 1"""), {"t": table, "n": row.attnum}).scalars().all()
    return ColumnFacts(column, row.attnum, row.type, row.attnotnull, row.default_expr,
                       row.comment, row.identity, row.generated, tuple(sequences),
                       row.not_null_constraint, row.not_null_comment, row.not_null_valid)


def identity(conn: Connection, table: str, attnum: int) -> IdentityFacts | None:
    """The identity of the column and its sequence's settings and state; None
    if it is not an identity column."""
    row = conn.execute(text("""
        WITH seq AS (
            SELECT a.attidentity, format('%I.%I', n.nspname, c.relname) AS name, s.*,
                   CASE s.seqtypid WHEN 'int2'::regtype THEN 32767
                                   WHEN 'int4'::regtype THEN 2147483647
                                   ELSE 9223372036854775807 END AS typemax
            FROM pg_attribute a
            JOIN pg_depend dep ON dep.refclassid = 'pg_class'::regclass
                 AND dep.refobjid = a.attrelid AND dep.refobjsubid = a.attnum
                 AND dep.classid = 'pg_class'::regclass AND dep.deptype = 'i'
            JOIN pg_class c ON c.oid = dep.objid AND c.relkind = 'S'
            JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_sequence s ON s.seqrelid = c.oid
            WHERE a.attrelid = to_regclass(:t) AND a.attnum = :n AND a.attidentity <> '')
        SELECT CASE attidentity WHEN 'a' THEN 'ALWAYS' ELSE 'BY DEFAULT' END AS kind, name,
               seqincrement, seqstart, seqcache, seqcycle,
               nullif(seqmin, CASE WHEN seqincrement > 0 THEN 1 ELSE -typemax - 1 END) AS minimum,
               nullif(seqmax, CASE WHEN seqincrement > 0 THEN typemax ELSE -1 END) AS maximum
        FROM seq"""), {"t": table, "n": attnum}).first()
    if row is None:
        return None
    # The sequence's name comes from the catalogue, quoted by format('%I').
    last_value, is_called = conn.execute(text(
        f"SELECT last_value, is_called FROM {row.name}")).one()
    return IdentityFacts(row.kind, row.name, row.seqincrement, row.seqstart, row.seqcache,
                         row.seqcycle, row.minimum, row.maximum, last_value, is_called)


def integer_width(conn: Connection, type_name: str) -> int | None:
    """Bytes of ``type_name`` if it is smallint, integer or bigint, else None."""
    return conn.execute(text("""
        SELECT CASE to_regtype(:type) WHEN 'int2'::regtype THEN 2 WHEN 'int4'::regtype THEN 4
                                      WHEN 'int8'::regtype THEN 8 END"""),
        {"type": type_name}).scalar()


def column_settings(conn: Connection, table: str, attnum: int) -> ColumnSettings:
    grants = conn.execute(text("""
        SELECT g.privilege_type,
               CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                    ELSE quote_ident(pg_get_userbyid(g.grantee)) END AS grantee,
               g.is_grantable
        FROM pg_attribute a, aclexplode(a.attacl) g
        WHERE a.attrelid = to_regclass(:t) AND a.attnum = :n
        ORDER BY 2, 1"""), {"t": table, "n": attnum}).all()
    # The default statistics target is NULL from PostgreSQL 17 on, -1 before
    # (attstattarget became nullable): nullif gives NULL for it on every major.
    row = conn.execute(text(f"""
        SELECT nullif(attstattarget, -1) AS attstattarget, {USER_ATTOPTIONS} AS options
        FROM pg_attribute
        WHERE attrelid = to_regclass(:t) AND attnum = :n"""), {"t": table, "n": attnum}).one()
    return ColumnSettings(tuple(ColumnGrant(*g) for g in grants), row.attstattarget,
                          tuple(row.options))


def covering_indexes(conn: Connection, table: str, attnum: int) -> list[IndexFacts]:
    """Indexes of the table that depend on the column, by name (deterministic)."""
    rows = conn.execute(text("""
        SELECT ic.relname, pg_get_indexdef(i.indexrelid) AS definition, i.indisvalid,
               obj_description(i.indexrelid, 'pg_class') AS comment,
               con.conname, con.contype, con.condeferrable, con.condeferred,
               obj_description(con.oid, 'pg_constraint') AS constraint_comment,
               ts.spcname, i.indisclustered, i.indisreplident,
               -- a default target is -1 (PostgreSQL 16 and older) or NULL (17 on)
               ARRAY(SELECT ARRAY[a.attnum, a.attstattarget] FROM pg_attribute a
                     WHERE a.attrelid = i.indexrelid AND a.attstattarget >= 0
                     ORDER BY a.attnum) AS statistics
        FROM pg_index i
        JOIN pg_class ic ON ic.oid = i.indexrelid
        LEFT JOIN pg_tablespace ts ON ts.oid = ic.reltablespace
        LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
             AND con.contype IN ('p', 'u', 'x')
        WHERE i.indrelid = to_regclass(:t)
          -- a key of the index, or used in its expressions or predicate (the
          -- index of a constraint depends on the constraint, not the column)
          AND (:n = ANY(i.indkey) OR EXISTS (
                SELECT 1 FROM pg_depend dep WHERE dep.classid = 'pg_class'::regclass
                AND dep.objid = i.indexrelid AND dep.refclassid = 'pg_class'::regclass
                AND dep.refobjid = i.indrelid AND dep.refobjsubid = :n))
        ORDER BY ic.relname"""), {"t": table, "n": attnum}).all()
    return [IndexFacts(r.relname, r.definition, r.indisvalid, r.comment, r.conname, r.contype,
                       bool(r.condeferrable), bool(r.condeferred), r.constraint_comment,
                       r.spcname, r.indisclustered, r.indisreplident,
                       tuple((n, target) for n, target in r.statistics))
            for r in rows]


def covering_constraints(conn: Connection, table: str, attnum: int) -> list[ConstraintFacts]:
    """CHECK and FOREIGN KEY constraints of the table that use the column."""
    rows = conn.execute(text("""
        SELECT conname, contype, pg_get_constraintdef(oid) AS definition, convalidated,
               obj_description(oid, 'pg_constraint') AS comment
        FROM pg_constraint
        WHERE conrelid = to_regclass(:t) AND contype IN ('c', 'f') AND :n = ANY(conkey)
        ORDER BY conname"""), {"t": table, "n": attnum}).all()
    return [ConstraintFacts(r.conname, r.contype, r.definition, r.convalidated, r.comment)
            for r in rows]


def blocking_dependents(conn: Connection, table: str, attnum: int) -> list[str]:
    """Objects depending on the column that a swap of columns cannot carry
    over, described as PostgreSQL describes them (``view v``, ``trigger t on
    table items``, ``column g of table items`` for a generated column, ...).
    The table's own indexes, its CHECK / FOREIGN KEY / PRIMARY KEY / UNIQUE
    constraints, its NOT NULL (a constraint from PostgreSQL 18 on), the
    column's default and the sequences it owns are carried over, so they are
    not listed (``referencing_foreign_keys`` lists foreign
    keys that point at the column)."""
    described = conn.execute(text("""
        SELECT DISTINCT pg_describe_object(dep.classid, dep.objid, 0)
        FROM pg_depend dep
        WHERE dep.refclassid = 'pg_class'::regclass AND dep.refobjid = to_regclass(:t)
          AND dep.refobjsubid = :n AND dep.deptype IN ('n', 'a')
          AND dep.classid <> 'pg_attrdef'::regclass
          AND dep.classid <> 'pg_class'::regclass  -- its indexes, sequences: carried over
          AND NOT (dep.classid = 'pg_constraint'::regclass AND EXISTS (
                SELECT 1 FROM pg_constraint c WHERE c.oid = dep.objid
                AND c.conrelid = dep.refobjid AND c.contype IN ('c', 'f', 'p', 'u', 'n')
                AND NOT (c.contype = 'f' AND c.confrelid = dep.refobjid)))
        ORDER BY 1"""), {"t": table, "n": attnum}).scalars().all()
    # A generated column's expression is its pg_attrdef, depending on the columns it reads.
    # PostgreSQL 14 records that as the generated column's own dependency on the
    # column (pg_class on pg_class, by attnum): missed, the DROP COLUMN of the
    # swap would drop the generated column with it (an auto dependency).
    generated = conn.execute(text("""
        SELECT format('generated column %s', a.attname) FROM pg_depend dep
        JOIN pg_attrdef ad ON ad.oid = dep.objid
        JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
        WHERE dep.classid = 'pg_attrdef'::regclass AND dep.refclassid = 'pg_class'::regclass
          AND dep.refobjid = to_regclass(:t) AND dep.refobjsubid = :n AND ad.adnum <> :n
        UNION
        SELECT format('generated column %s', a.attname) FROM pg_depend dep
        JOIN pg_attribute a ON a.attrelid = dep.objid AND a.attnum = dep.objsubid
        WHERE dep.classid = 'pg_class'::regclass AND dep.objid = to_regclass(:t)
          AND dep.refclassid = 'pg_class'::regclass AND dep.refobjid = to_regclass(:t)
          AND dep.refobjsubid = :n AND dep.objsubid NOT IN (0, :n) AND a.attgenerated <> ''
        ORDER BY 1"""), {"t": table, "n": attnum}).scalars().all()
    views = [d.replace("rule _RETURN on ", "") for d in described]
    return views + list(generated)


def referencing_foreign_keys(conn: Connection, table: str, attnum: int) -> list[str]:
    """Foreign keys of other tables (or of this one) that reference the column."""
    return list(conn.execute(text("""
        SELECT format('%s on %s', conname, conrelid::regclass) FROM pg_constraint
        WHERE contype = 'f' AND confrelid = to_regclass(:t) AND :n = ANY(confkey)
        ORDER BY 1"""), {"t": table, "n": attnum}).scalars())


@dataclass(frozen=True)
class Inheritance:
    """Where the table stands in an inheritance tree or a partitioning (each
    relation as ``regclass`` prints it)."""

    partitioned: bool  # PARTITION BY: its partitions are its children
    partition_of: str | None  # the partitioned table it is a partition of
    parents: tuple[str, ...]  # INHERITS (..., or the table it is a partition of)
    children: tuple[str, ...]  # tables inheriting from it, or its partitions

    @property
    def plain(self) -> bool:
        return not (self.partitioned or self.parents or self.children)


def inheritance(conn: Connection, table: str) -> Inheritance | None:
    """None if the table does not exist."""
    row = conn.execute(text("""
        SELECT c.relkind = 'p' AS partitioned,
               (SELECT i.inhparent::regclass::text FROM pg_inherits i
                WHERE i.inhrelid = c.oid AND c.relispartition) AS partition_of,
               ARRAY(SELECT i.inhparent::regclass::text FROM pg_inherits i
                     WHERE i.inhrelid = c.oid ORDER BY i.inhseqno) AS parents,
               ARRAY(SELECT i.inhrelid::regclass::text FROM pg_inherits i
                     WHERE i.inhparent = c.oid ORDER BY 1) AS children
        FROM pg_class c WHERE c.oid = to_regclass(:t)"""), {"t": table}).first()
    if row is None:
        return None
    return Inheritance(row.partitioned, row.partition_of, tuple(row.parents),
                       tuple(row.children))


def leaf_partitions(conn: Connection, table: str) -> list[str]:
    """The partitions holding the rows of a partitioned table, at every level
    (as ``regclass`` prints them); none for another table."""
    return list(conn.execute(text(
        "SELECT relid::regclass::text FROM pg_partition_tree(to_regclass(:t)) "
        "WHERE isleaf AND relid <> to_regclass(:t) ORDER BY 1"), {"t": table}).scalars())


def constraint_names(conn: Connection, table: str) -> list[str]:
    return list(conn.execute(text(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:t) ORDER BY 1"),
        {"t": table}).scalars())


def narrower_sequence(conn: Connection, sequence: str, type_name: str) -> str | None:
    """The integer type ``type_name`` names (smallint, integer, bigint) if
    ``sequence`` is of a narrower one; None if not, or if ``type_name`` is
    not one of them (the sequence then stays as it is)."""
    return conn.execute(text("""
        WITH widths (type, width) AS (VALUES ('smallint'::regtype, 2), ('integer'::regtype, 4),
                                             ('bigint'::regtype, 8))
        SELECT format_type(wanted.type, NULL) FROM pg_sequence s
        JOIN widths now ON now.type = s.seqtypid
        JOIN widths wanted ON wanted.type = to_regtype(:type)
        WHERE s.seqrelid = to_regclass(:s) AND wanted.width > now.width"""),
        {"s": sequence, "type": type_name}).scalar()
