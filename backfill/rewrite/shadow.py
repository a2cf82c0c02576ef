"""The shadow table in the new shape, and how the copy fills it.

Forms (``Request``): the same shape (repack); ``--order-by a,b`` (the same
shape, copied in that order); ``--alter "..."`` (actions of one ALTER TABLE
applied to the empty shadow, ``alter``); ``--like FILE`` (a CREATE TABLE of
any shape, ``like``); and with each, ``--set col=EXPR`` (the column's value
in the copy, an expression of T's row).

The same shape is ``CREATE TABLE ... (LIKE T INCLUDING DEFAULTS, IDENTITY,
GENERATED, STORAGE, COMPRESSION)`` with T's persistence, access method,
reloptions (table and TOAST), tablespace, and its columns' statistics
targets and options: what describes the table's rows and storage is made
with the shadow (so an --alter can change it), what relates T to other
objects is carried by the swap (``carry``). No index and no constraint but
NOT NULL: the build step makes them (``builds``).

``plan`` checks everything at submit by doing it: it creates the shadow,
applies the --alter, makes every index and constraint and EXPLAINs the
copy's statement for each column, in a savepoint it rolls back (cheap: the
shadow is empty). A failure is refused in one line naming the object.
The plan's statements are kept in the job's params (``to_params``), so
every worker and an heir run exactly what was checked."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.expressions import embed
from backfill.rewrite import alter as alter_actions
from backfill.rewrite import builds as shadow_builds
from backfill.rewrite import like as like_file
from backfill.rewrite import names
from backfill.rewrite.builds import Build
from backfill.rewrite.qualified import qualified_names
from backfill.schema.catalog import USER_ATTOPTIONS
from backfill.schema.sql import run
from backfill.tables import KEY_TYPES, inspect_table
from framework.errors import InvalidParams, one_line
from framework.keys import END, Key, KeySpec, quote

LIKE_OPTIONS = ("INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED INCLUDING STORAGE "
                "INCLUDING COMPRESSION")


@dataclass(frozen=True)
class Request:
    """What the user asked for (the four forms; ``sets`` goes with each)."""

    order_by: tuple[str, ...] = ()
    alter: str | None = None
    like: str | None = None  # the text of the --like file
    sets: tuple[tuple[str, str], ...] = ()  # (column, expression of T's row)
    # Columns whose value the copy gets from elsewhere (``--engine spark``'s
    # --set, computed on Spark): checked as a --set's, left out of ``columns``.
    computed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Column:
    name: str  # the shadow's column (unquoted)
    value: str  # its value in the copy: SQL over T's row


@dataclass(frozen=True)
class Plan:
    job_id: int
    schema: str  # T's schema, also the shadow's (unquoted)
    table_name: str  # T's bare name (unquoted)
    shadow_name: str
    key: KeySpec  # T's key: the change log's, and how a replay finds a row
    copy_key: KeySpec  # the key the copy ranges over (--order-by columns, then T's key)
    create: tuple[str, ...]  # the shadow, in the new shape, empty
    columns: tuple[Column, ...]  # the copy's columns; the others take their default
    overriding: bool  # the copy writes a GENERATED ALWAYS identity column
    order_by: tuple[str, ...]
    builds: tuple[Build, ...]  # the build step's indexes and constraints
    notes: tuple[str, ...]  # T's indexes and constraints that are not built, one line each
    partitioned: bool
    shape: tuple[tuple[str, str], ...] = ()  # the new shape's columns and types
    source: tuple[tuple[str, str], ...] = ()  # T's columns and types (generated ones aside)

    @property
    def table(self) -> str:
        return f"{quote(self.schema)}.{quote(self.table_name)}"

    @property
    def shadow(self) -> str:
        return f"{quote(self.schema)}.{quote(self.shadow_name)}"

    def index_names(self) -> set[str]:
        """The new table's index (and index-backed constraint) names after the swap."""
        return {b.final for b in self.builds if b.kind == "index" or b.temp != b.final}

    def select(self, where: str) -> str:
        """The copy's rows of T matching ``where``, as the shadow takes them."""
        values = ", ".join(c.value for c in self.columns)
        return f"SELECT {values} FROM {self.table} WHERE {where}"

    def insert_into(self, target: str, select: str) -> str:
        columns = ", ".join(quote(c.name) for c in self.columns)
        overriding = " OVERRIDING SYSTEM VALUE" if self.overriding else ""
        return f"INSERT INTO {target} ({columns}){overriding} {select}"

    def insert(self, lo: Key, hi: Key) -> str:
        """One batch of the copy: the rows of T in ``[lo, hi)`` of ``copy_key``
        (``hi`` may be END), in --order-by order when one was asked for."""
        select = self.select(self.copy_key.between(lo, hi))
        if self.order_by:
            select += f" ORDER BY {self.copy_key.order_by()}"
        return self.insert_into(self.shadow, select)

    def to_params(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "schema": self.schema, "table_name": self.table_name,
            "shadow_name": self.shadow_name, "key": _key_param(self.key),
            "copy_key": _key_param(self.copy_key), "create": list(self.create),
            "columns": [[c.name, c.value] for c in self.columns], "overriding": self.overriding,
            "order_by": list(self.order_by), "builds": [b.to_param() for b in self.builds],
            "notes": list(self.notes), "partitioned": self.partitioned,
            "shape": [list(c) for c in self.shape], "source": [list(c) for c in self.source],
        }

    @staticmethod
    def from_params(p: dict[str, Any]) -> Plan:
        return Plan(p["job_id"], p["schema"], p["table_name"], p["shadow_name"],
                    KeySpec.of(*p["key"]), KeySpec.of(*p["copy_key"]), tuple(p["create"]),
                    tuple(Column(n, v) for n, v in p["columns"]), p["overriding"],
                    tuple(p["order_by"]), tuple(Build.from_param(b) for b in p["builds"]),
                    tuple(p["notes"]), p["partitioned"], tuple(map(tuple, p["shape"])),
                    tuple(map(tuple, p["source"])))


def _key_param(key: KeySpec) -> list[list[str]]:
    return [list(key.columns), list(key.types)]


# -- the plan, checked -------------------------------------------------------------


def plan(conn: Connection, table_name: str, job_id: int, request: Request) -> Plan:
    """The plan of a rewrite of ``table_name``, or InvalidParams (one line).
    Leaves nothing behind: what it tries runs in a savepoint rolled back."""
    _refuse_table_kind(conn, table_name)
    info = inspect_table(conn, table_name, any_key=True)
    schema, bare = conn.execute(text(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:t)"), {"t": table_name}).one()
    shadow_name = names.shadow_table(job_id, bare)
    if conn.execute(text("SELECT to_regclass(:s) IS NOT NULL"),
                    {"s": f"{quote(schema)}.{quote(shadow_name)}"}).scalar():
        raise InvalidParams(f"{schema}.{shadow_name} exists already (the shadow table of job "
                            f"{job_id}); drop it if it is a leftover")
    if request.alter is not None and request.like is not None:
        raise InvalidParams("--alter and --like both give the new shape; give one of them")
    copy_key = _copy_key(conn, info.qualified, info.columns, info.key_spec, request.order_by)
    alter = (alter_actions.parse(request.alter, schema, shadow_name, bare)
             if request.alter is not None else None)
    like = like_file.parse(request.like, schema, shadow_name, bare) if request.like else None
    create = list(like.create) if like else _same_shape(conn, info.qualified, schema, shadow_name)
    if alter and alter.shape:
        create.append(alter.shape)
    draft = Plan(job_id, schema, bare, shadow_name, info.key_spec, copy_key, tuple(create),
                 (), False, tuple(request.order_by), (), (), bool(like and like.partitioned))
    with conn.begin_nested() as trial:
        _run_all(conn, draft.create, "--like does not create a table: " if like
                 else f"--alter does not apply to {draft.table}: " if alter
                 else f"the shadow of {draft.table} cannot be created: ")
        shape = _shadow_columns(conn, draft.shadow)
        columns, overriding = _columns(shape, info.columns, info.key_spec, request, alter)
        draft = replace(draft, columns=tuple(columns), overriding=overriding,
                        shape=tuple((n, c.type) for n, c in shape.items()),
                        source=_source_columns(conn, info.qualified))
        made, notes = _builds(conn, draft, set(shape), alter, like)
        draft = replace(draft, builds=tuple(shadow_builds.in_order(made)), notes=tuple(notes))
        _check_copy(conn, draft)
        _check_builds(conn, draft)
        trial.rollback()
    return draft


def _refuse_table_kind(conn: Connection, name: str) -> None:
    row = conn.execute(text("""
        SELECT c.relkind, c.relispartition, c.relpersistence,
               EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid
                       OR i.inhparent = c.oid) AS inherits
        FROM pg_class c WHERE c.oid = to_regclass(:t)"""), {"t": name}).first()
    if row is None:
        return  # inspect_table says it does not exist
    if row.relkind == "p":
        raise InvalidParams(f"table {name} is partitioned; a rewrite swaps a plain table (a "
                            "partitioned one is not carried over yet); rewrite it offline")
    if row.relispartition:
        raise InvalidParams(f"table {name} is a partition; a rewrite cannot swap a partition "
                            "of its table (not carried over yet); rewrite it offline")
    if row.inherits:
        raise InvalidParams(f"table {name} is part of an inheritance tree; a rewrite swaps a "
                            "plain table only")
    if row.relpersistence == "t":
        raise InvalidParams(f"table {name} is temporary; no other session can rewrite it")


def _same_shape(conn: Connection, table: str, schema: str, shadow_name: str) -> list[str]:
    row = conn.execute(text("""
        SELECT c.relpersistence, am.amname, coalesce(c.reloptions, '{}') AS options,
               coalesce(t.reloptions, '{}') AS toast_options, ts.spcname
        FROM pg_class c
        LEFT JOIN pg_am am ON am.oid = c.relam
        LEFT JOIN pg_class t ON t.oid = c.reltoastrelid
        LEFT JOIN pg_tablespace ts ON ts.oid = c.reltablespace
        WHERE c.oid = to_regclass(:t)"""), {"t": table}).one()
    shadow = f"{quote(schema)}.{quote(shadow_name)}"
    options = [*row.options, *(f"toast.{o}" for o in row.toast_options)]
    statement = (f"CREATE {'UNLOGGED ' if row.relpersistence == 'u' else ''}TABLE {shadow} "
                 f"(LIKE {table} {LIKE_OPTIONS})"
                 + (f" USING {quote(row.amname)}" if row.amname not in (None, "heap") else "")
                 + (f" WITH ({', '.join(options)})" if options else "")
                 + (f" TABLESPACE {quote(row.spcname)}" if row.spcname else ""))
    statements = [statement]
    # The default statistics target is NULL from PostgreSQL 17 on, -1 before
    # (attstattarget became nullable): nullif gives NULL for it on every major.
    for column, target, attoptions in conn.execute(text(f"""
            SELECT attname, nullif(attstattarget, -1), {USER_ATTOPTIONS} FROM pg_attribute
            WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped
              AND (attstattarget >= 0 OR attoptions IS NOT NULL)
            ORDER BY attnum"""), {"t": table}):
        if target is not None:
            statements.append(f"ALTER TABLE {shadow} ALTER COLUMN {quote(column)} "
                              f"SET STATISTICS {int(target)}")
        if attoptions:
            statements.append(f"ALTER TABLE {shadow} ALTER COLUMN {quote(column)} "
                              f"SET ({', '.join(attoptions)})")
    return statements


def _copy_key(conn: Connection, table: str, columns: dict[str, str], key: KeySpec,
              order_by: tuple[str, ...]) -> KeySpec:
    """T's key, or with --order-by its columns first, then the key's others:
    unique, so the copy ranges over it, each range in order."""
    if not order_by:
        return key
    for column in order_by:
        if column not in columns:
            raise InvalidParams(f"--order-by: column {column} does not exist in {table}; "
                                f"columns: {', '.join(columns)}")
        if not columns[column].startswith(KEY_TYPES):
            raise InvalidParams(f"--order-by: column {column} is of type {columns[column]}; "
                                "the copy ranges over it and takes integers, numeric, text, "
                                "varchar, uuid, date, timestamps or booleans")
    facts = conn.execute(text("""
        SELECT attname, attnotnull, attcollation IN (0, 100) AS default_collation
        FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attname = ANY(:c)"""),
        {"t": table, "c": list(order_by)}).all()
    for name, not_null, default_collation in facts:
        if not not_null:
            raise InvalidParams(f"--order-by: column {name} may be NULL; the copy ranges over "
                                "the order and a NULL has no place in a range: SET NOT NULL "
                                "first, or order by other columns")
        if not default_collation:
            raise InvalidParams(f"--order-by: column {name} has a collation other than the "
                                "database's default; the copy orders by the default one")
    leading = conn.execute(text("""
        SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
        JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'btree'
        WHERE i.indrelid = to_regclass(:t) AND i.indisvalid AND i.indpred IS NULL
          AND (SELECT array_agg(a.attname ORDER BY k.ord) FROM
               unnest((i.indkey::int2[])[0:cardinality(CAST(:c AS name[])) - 1])
                 WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)
              = CAST(:c AS name[])"""), {"t": table, "c": list(order_by)}).first()
    if leading is None:
        raise InvalidParams(f"--order-by {','.join(order_by)}: {table} has no index starting "
                            "with these columns; the copy reads T in ranges of that order: "
                            f"CREATE INDEX CONCURRENTLY ON {table} ({', '.join(order_by)}) first")
    rest = [c for c in key.columns if c not in order_by]
    return KeySpec.of([*order_by, *rest], [columns[c] for c in (*order_by, *rest)])


def _run_all(conn: Connection, statements: tuple[str, ...], fails: str) -> None:
    for statement in statements:
        try:
            with conn.begin_nested():
                run(conn, statement)
        except Exception as exc:
            raise InvalidParams(f"{fails}{one_line(exc)}") from None


@dataclass(frozen=True)
class _ShadowColumn:
    type: str
    not_null: bool
    has_default: bool
    identity: str  # '', 'a' (ALWAYS) or 'd' (BY DEFAULT)
    generated: bool


def _shadow_columns(conn: Connection, shadow: str) -> dict[str, _ShadowColumn]:
    rows = conn.execute(text("""
        SELECT attname, format_type(atttypid, atttypmod), attnotnull, atthasdef,
               attidentity, attgenerated <> ''
        FROM pg_attribute WHERE attrelid = to_regclass(:s) AND attnum > 0 AND NOT attisdropped
        ORDER BY attnum"""), {"s": shadow}).all()
    return {r[0]: _ShadowColumn(r[1], r[2], r[3], r[4], r[5]) for r in rows}


def _source_columns(conn: Connection, table: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, t) for n, t in conn.execute(text("""
        SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
        WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped
          AND attgenerated = '' ORDER BY attnum"""), {"t": table}))


def _columns(shape: dict[str, _ShadowColumn], source: dict[str, str], key: KeySpec,
             request: Request, alter: alter_actions.Alter | None) -> tuple[list[Column], bool]:
    """Each column of the new shape and its value from T's row; refused
    where a column cannot be filled or the key would not keep its values."""
    sets = dict(request.sets)
    computed = set(request.computed)
    using = alter.using if alter else {}
    for column in [*sets, *computed]:
        if column not in shape:
            raise InvalidParams(f"--set {column}: the new shape has no column {column}; "
                                f"its columns: {', '.join(shape)}")
        if shape[column].generated:
            raise InvalidParams(f"--set {column}: column {column} is generated; PostgreSQL "
                                "computes it, nothing can set it")
    for column in key.columns:
        if column not in shape or shape[column].generated:
            raise InvalidParams(
                f"the new shape has no column {column} of the key {key.described()} of the "
                "table; a rewrite finds each changed row by that key: keep the column")
        if column in sets or column in computed or column in using:
            how = "--alter ... USING" if column in using else "--set"
            raise InvalidParams(
                f"{how} changes column {column} of the key {key.described()}; a rewrite finds "
                "each changed row by that key, whose values must stay (a type change without "
                "USING keeps them)")
    columns: list[Column] = []
    for name, facts in shape.items():
        if facts.generated or name in computed:
            continue
        if name in sets:
            value = embed(sets[name])
        elif name in using:
            value = f"({using[name]})"
        elif name in source:
            value = quote(name)
        elif facts.not_null and not facts.has_default and not facts.identity:
            raise InvalidParams(f"column {name} of the new shape is NOT NULL without a default "
                                f"and not in the table; give --set {name}=EXPR (an expression "
                                "of the table's row) or a DEFAULT")
        else:
            continue  # a new column: its default, or its identity's next value
        columns.append(Column(name, value))
    overriding = any(shape[c].identity == "a" for c in [*(c.name for c in columns), *computed])
    return columns, overriding


def _builds(conn: Connection, draft: Plan, columns: set[str],
            alter: alter_actions.Alter | None,
            like: like_file.Like | None) -> tuple[list[Build], list[str]]:
    target = shadow_builds.Shadow(draft.job_id, draft.schema, draft.shadow_name,
                                  draft.partitioned)
    if like is not None:
        made = [shadow_builds.of_constraint(target, c) for c in like.constraints]
        made += [shadow_builds.of_like_index(target, i) for i in like.indexes]
        return made, ["the table's indexes and constraints: replaced by those of --like"]
    dropped = set(alter.dropped_constraints) if alter else set()
    with qualified_names(conn):
        made, notes = shadow_builds.of_table(conn, draft.table, target, columns, dropped)
    known = set(conn.execute(text("SELECT conname FROM pg_constraint WHERE conrelid = "
                                  "to_regclass(:t)"), {"t": draft.table}).scalars())
    for name in sorted(dropped - known):
        raise InvalidParams(f"--alter drops constraint {name}, which {draft.table} does not "
                            "have; check its name (\\d of the table)")
    for added in alter.added if alter else ():
        made.append(shadow_builds.of_constraint(target, added))
    return made, notes


def _check_copy(conn: Connection, plan: Plan) -> None:
    """EXPLAIN the copy for each column (to name the one that does not fit),
    then as a whole, and the replay's match of the shadow's key with T's."""
    for column in plan.columns:
        one = replace(plan, columns=(column,))
        _explain(conn, one.insert_into(plan.shadow, one.select("false")),
                 f"column {column.name} of the new shape ({column.value}) cannot be copied "
                 f"from {plan.table}")
    _explain(conn, plan.insert(*_sample_range(plan.copy_key)),
             f"the copy into the new shape of {plan.table} does not plan")
    match = " AND ".join(f"s.{quote(c)} = t.{quote(c)}" for c in plan.key.columns)
    _explain(conn, f"SELECT 1 FROM {plan.shadow} s JOIN {plan.table} t ON {match}",
             f"the key {plan.key.described()} of the new shape does not compare with the "
             "table's (a rewrite finds each changed row by it)")


def _sample_range(key: KeySpec) -> tuple[Key, Key]:
    return (0, 1) if key.arithmetic else (tuple(None for _ in key.types), END)


def _explain(conn: Connection, statement: str, fails: str) -> None:
    try:
        with conn.begin_nested():
            run(conn, f"EXPLAIN {statement}")
    except Exception as exc:
        raise InvalidParams(f"{fails}: {one_line(exc)}") from None


def _check_builds(conn: Connection, plan: Plan) -> None:
    for build in plan.builds:
        for statement in (*build.statements, *filter(None, [build.validate])):
            try:
                with conn.begin_nested():
                    run(conn, statement)
            except Exception as exc:
                raise InvalidParams(f"{build.kind} {build.final} cannot be built on the new "
                                    f"shape: {one_line(exc)}") from None
