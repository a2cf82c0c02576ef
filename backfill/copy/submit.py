"""Submit-time checks of a ``copy`` job: the source, the target and every
``--select``, analysed on Spark against both tables and dry-run on sample
rows (what a copy promises: ``backfill.copy``, ``backfill.copy.job``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.copy.batches import CopySpec, OutputColumn, pg_type_of
from backfill.expressions import embed, optional_expression
from backfill.spark.expression_guard import check_spark_expression
from backfill.spark.failures import first_line
from backfill.spark.sizing import ROWS_PER_SUBTASK
from backfill.spark.validation import DRY_RUN_ROWS, dry_run, start_spark_first
from backfill.tables import (
    PLAIN_NAME,
    TableInfo,
    check_where,
    inspect_table,
    quote,
    relation_exists,
)
from framework import privileges
from framework.errors import InvalidParams
from framework.keys import decode, shown
from framework.privileges import run_as
from framework.records import Job, Target


def validate(conn: Connection, params: dict[str, Any]) -> Target:
    """What PostgreSQL answers: the tables, the key, --where, no clashing keys.
    The selects are analysed on Spark by ``analyse``."""
    src = inspect_table(conn, params.get("table", ""), any_key=True)
    selects = [s.strip() for s in params.get("select") or [] if s and s.strip()]
    if not selects:
        raise InvalidParams(
            f"no --select given; list the target's columns, e.g. --select {src.key} "
            "--select 'upper(b) AS b'")
    where = optional_expression(params.get("where"), "--where")
    if where:
        check_where(conn, src, where)
    create = bool(params.get("create_target"))
    target_name = (params.get("target") or "").strip()
    if not target_name:
        raise InvalidParams("no --target given; name the table to copy into, e.g. "
                            "--target public.items_copy")
    dst = None if create else _existing_target(conn, src, target_name)
    target_sql, target_display = ((dst.qualified, dst.display) if dst
                                  else _new_table_name(conn, target_name))
    if target_sql == src.qualified:
        raise InvalidParams(f"--target {target_display} is the source table; copy into "
                            "another table")
    if dst is not None:
        _check_no_overlap(conn, src, dst, where)
    _check_submitter_may(conn, src, dst, target_sql if dst is None else None)
    normalised = {k: v for k, v in params.items() if v is not None}
    normalised |= {"select": selects, "where": where, "create_target": create,
                   "key": src.key, "target_table": target_sql, "target": target_display}
    normalised.setdefault("rows_per_subtask", ROWS_PER_SUBTASK)
    return Target(src.qualified, src.key_sql, normalised, key=src.key_spec)


def _check_submitter_may(conn: Connection, src: TableInfo, dst: TableInfo | None,
                         new_table: str | None) -> None:
    """The job may do no more than its submitter (framework.privileges): its
    reads run as the submitter, its writes are the ones checked here."""
    privileges.check_table_privileges(conn, src.qualified, src.display, ("SELECT",))
    if dst is not None:
        privileges.check_table_privileges(conn, dst.qualified, dst.display, ("INSERT",))
    elif new_table is not None:
        schema = new_table.rsplit(".", 1)[0]
        may = conn.execute(text("SELECT has_schema_privilege(CAST(:s AS regnamespace), 'CREATE')"),
                           {"s": schema}).scalar()
        if not may:
            raise InvalidParams(
                f"--create-target creates a table in schema {schema}, where your role may not "
                f"create tables; GRANT CREATE ON SCHEMA {schema} to it, or pick another schema")


def analyse(conn: Connection, job: Job) -> dict[str, Any]:
    """Each --select on Spark against both tables, dry-run on sample rows;
    returns the params with the target's columns (name, type, source)."""
    p = job.params
    start_spark_first(conn, job.target_table)
    src = inspect_table(conn, job.target_table, any_key=True)
    dst = None if p["create_target"] else inspect_table(conn, p["target_table"], any_key=True)
    from backfill.spark.quiet import quiet_analysis_errors

    with quiet_analysis_errors():
        columns = _check_with_spark(conn, src, dst, p["select"], p.get("where"), run_as(job))
    if dst is not None:
        _check_target_columns(conn, dst, columns)
    return {**p, "columns": [c.to_param() for c in columns]}


def _existing_target(conn: Connection, src: TableInfo, name: str) -> TableInfo:
    if not relation_exists(conn, name):
        raise InvalidParams(
            f"target table {name!r} does not exist; create it, or pass --create-target "
            "to have the copy create it")
    try:
        dst = inspect_table(conn, name, any_key=True)
    except InvalidParams as exc:
        raise InvalidParams(
            f"target {name}: {exc}".replace("reorg needs", "copy needs")) from None
    if dst.key != src.key:
        raise InvalidParams(
            f"target {dst.display} has primary key ({dst.key}) but the key of "
            f"{src.display} is {src.key}; the target needs the same key column")
    if not dst.key_spec.matches(src.key_spec):
        # The key's values are copied as PostgreSQL's text of them: the same
        # columns of the same types, or a row could land under another key.
        raise InvalidParams(
            f"target {dst.display} is keyed by {dst.key_spec.described()} but "
            f"{src.display} by {src.key_spec.described()}; the target needs the same key "
            "columns of the same types")
    return dst


def _check_with_spark(conn: Connection, src: TableInfo, dst: TableInfo | None,
                      selects: list[str], where: str | None, role: str | None) -> list[OutputColumn]:
    """Analyse each select on an empty DataFrame of SRC's schema, check it
    against the target, then dry-run all of them on a few rows and land
    those in a temporary stage inside a savepoint that is rolled back."""
    from backfill.copy.batches import copy_rows
    from backfill.spark.jdbc import jdbc_target, schema_probe
    from backfill.spark.landing import to_csv
    from backfill.spark.session import get_validation_spark

    spark = get_validation_spark()
    jdbc = jdbc_target(conn.engine.url, role)  # the sample is read as the submitter
    empty = schema_probe(spark, jdbc, f"SELECT * FROM {src.qualified}")
    dst_types: dict[str, Any] = {}
    if dst is not None:
        probe = schema_probe(spark, jdbc, f"SELECT * FROM {dst.qualified}")
        dst_types = {f.name: f.dataType for f in probe.schema.fields}
    columns: list[OutputColumn] = []
    seen: set[str] = set()
    for expr in selects:
        name, dtype, source = _analyse(empty, expr, src.display)
        if name.lower() in seen:
            raise InvalidParams(f"--select names column {name} twice; give each output "
                                "its own name (... AS name)")
        seen.add(name.lower())
        columns.append(_output_column(expr, name, dtype, source, src, dst, dst_types))
    for key_column in src.key_spec.columns:
        if not any(c.name == key_column for c in columns):
            raise InvalidParams(f"--select must copy the key column {key_column} unchanged; "
                                f"add --select {key_column}")
    spec = CopySpec(job_id=0, source=src.qualified, key=src.key_sql, key_name=src.key,
                    target="", columns=tuple(columns), where=where, created=dst is None,
                    work_schema="", source_key=src.key_spec)
    with dry_run("--select", src.display, where):
        sample = spark.read.jdbc(jdbc.url, spec.base_query(limit=DRY_RUN_ROWS),
                                 properties=jdbc.read_props())
        types = {c.name: dst_types[c.name] for c in columns if not c.source} if dst else None
        rows = spec.output(sample, types).toArrow()
        with conn.begin_nested() as savepoint:
            raw = conn.connection.driver_connection
            conn.exec_driver_sql(spec.create_stage())
            copy_rows(raw, spec, to_csv(rows))
            savepoint.rollback()
    return columns


def _output_column(expr: str, name: str, dtype: Any, source: str | None, src: TableInfo,
                   dst: TableInfo | None, dst_types: dict[str, Any]) -> OutputColumn:
    """One analysed ``--select`` (``_analyse``) checked against the source key
    and the target: the column it writes, with its PostgreSQL type and the
    source column it copies verbatim (None: computed by Spark)."""
    from backfill.spark import compat

    if name in src.key_spec.columns and source != name:
        raise InvalidParams(
            f"--select {expr!r} changes the key column {name}; copy keeps keys "
            f"as they are: use --select {name}")
    if dst is None:
        if source is not None:
            return OutputColumn(name, expr, src.columns[source], source)
        mapped = pg_type_of(dtype)
        if mapped is None:
            raise InvalidParams(_unwritable(expr, dtype))
        return OutputColumn(name, expr, mapped, None)
    if name not in dst.columns:
        raise InvalidParams(
            f"--select {expr!r} writes column {name}, which {dst.display} does not "
            f"have; name an existing column (... AS col) or add it to {dst.display}")
    pg_type = dst.columns[name]
    if source is not None and src.columns[source] != pg_type:
        source = None  # different types: convert through Spark, checked below
    if source is None:
        target = dst_types[name]
        if not compat.landable(target):
            raise InvalidParams(
                f"column {name} of {dst.display} is {pg_type}, which copy can only "
                f"fill from a source column of the same type")
        if not compat.can_land(dtype, target):
            raise InvalidParams(
                f"--select {expr!r} yields {dtype.simpleString()} but column {name} "
                f"of {dst.display} is {pg_type}; wrap it in "
                f"CAST(... AS {target.simpleString()})")
    return OutputColumn(name, expr, pg_type, source)


def _analyse(empty: Any, expr: str, display: str) -> tuple[str, Any, str | None]:
    """One select on the empty source DataFrame: its output name, Spark type,
    and the source column it copies verbatim (None when it computes)."""
    check_spark_expression(empty.sparkSession, expr, "--select")
    try:
        out = empty.selectExpr(expr)
        fields = out.schema.fields
    except Exception as exc:
        raise InvalidParams(
            f"--select {expr!r} is not a Spark SQL expression over {display}: "
            f"{first_line(exc)}") from None
    if len(fields) != 1:
        raise InvalidParams(f"--select {expr!r} gives {len(fields)} columns; give one "
                            "expression per --select")
    name, dtype = fields[0].name, fields[0].dataType
    plain, source = _projection(empty, out)
    if not plain:
        raise InvalidParams(
            f"--select {expr!r} is not a per-row expression (aggregate, window or generator); "
            "copy maps each source row to one target row")
    if not PLAIN_NAME.match(name):
        raise InvalidParams(f"--select {expr!r} gives column name {name!r}; name it with "
                            "letters, digits and underscores: ... AS name")
    if dtype.typeName() == "void":
        raise InvalidParams(f"--select {expr!r} has no type; write CAST(NULL AS type)")
    return name, dtype, source


def _projection(empty: Any, out: Any) -> tuple[bool, str | None]:
    """Whether ``out`` is a plain projection of ``empty`` (one row per row), and
    if its one column is a bare source column, that column's name. Reads the
    analysed plan through py4j; if that fails, assume a projection that computes."""
    try:
        plan = out._jdf.queryExecution().analyzed()  # noqa: SLF001 - no public API
        base = empty._jdf.queryExecution().analyzed()  # noqa: SLF001
        if plan.getClass().getSimpleName() != "Project" or not plan.child().sameResult(base):
            return False, None
        item = plan.projectList().apply(0)
        kind = item.getClass().getSimpleName()
        if kind == "Alias":
            item = item.child()
            kind = item.getClass().getSimpleName()
        return True, (str(item.name()) if kind == "AttributeReference" else None)
    except Exception:
        return True, None


def _unwritable(expr: str, dtype: Any) -> str:
    return (f"--select {expr!r} yields {dtype.simpleString()}, which copy cannot create a "
            "column for; cast it to a scalar type (e.g. CAST(... AS string))")


def _new_table_name(conn: Connection, name: str) -> tuple[str, str]:
    """``[schema.]table`` for --create-target: plain names, folded to lower
    case as PostgreSQL does; the schema must exist and the table must not."""
    parts = name.split(".")
    if len(parts) > 2 or not all(PLAIN_NAME.match(p) for p in parts):
        raise InvalidParams(f"--target {name!r} is not [SCHEMA.]TABLE with plain names, "
                            "e.g. --target public.items_copy")
    if relation_exists(conn, name):
        raise InvalidParams(f"target table {name} already exists; drop --create-target to "
                            "copy into it, or name a new table")
    if len(parts) == 1:
        schema = conn.execute(text("SELECT current_schema()")).scalar()
        if schema is None:
            raise InvalidParams(f"no schema to create {name} in; write --target SCHEMA.{name}")
        table = parts[0].lower()
    else:
        schema, table = parts[0].lower(), parts[1].lower()
        if not conn.execute(text("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = :s)"),
                            {"s": schema}).scalar():
            raise InvalidParams(f"schema {schema} does not exist; create it first or choose "
                                "another --target")
    return f"{quote(schema)}.{quote(table)}", f"{schema}.{table}"


def _check_target_columns(conn: Connection, dst: TableInfo, columns: list[OutputColumn]) -> None:
    """Target columns the copy leaves out must be fillable (nullable or with a
    default); generated columns cannot be written."""
    written = {c.name for c in columns}
    rows = conn.execute(text("""
        SELECT attname, attnotnull, atthasdef, attidentity <> '' AS ident, attgenerated <> '' AS gen
        FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped"""),
                        {"t": dst.qualified}).all()
    for r in rows:
        if r.attname in written and r.gen:
            raise InvalidParams(f"column {r.attname} of {dst.display} is generated; leave it "
                                "out of --select")
        if r.attname not in written and r.attnotnull and not (r.atthasdef or r.ident):
            raise InvalidParams(
                f"column {r.attname} of {dst.display} is NOT NULL without a default and no "
                f"--select writes it; add --select '... AS {r.attname}'")


def _check_no_overlap(conn: Connection, src: TableInfo, dst: TableInfo, where: str | None) -> None:
    """Refuse a target that already holds keys the copy would write: its rows
    must keep their values, and rollback removes only what the job wrote.
    The source's smallest and largest keys by index (no min() of a row), then
    two index probes when the key spans do not meet; a semi-join otherwise."""
    key = src.key_spec
    first, last = (conn.execute(text(
        f"SELECT {key.read()} FROM {src.qualified} ORDER BY {order} LIMIT 1")).scalar()
        for order in (key.order_by(), ", ".join(f"{c} DESC" for c in key.names())))
    if first is None:
        return
    span = (f"{key.expr('d')} >= {key.param('lo')} AND {key.expr('d')} <= {key.param('hi')}")
    bounds = {"lo": key.bind(decode(first)), "hi": key.bind(decode(last))}
    near = conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {dst.qualified} d WHERE {span})"),
                        bounds).scalar()
    if not near:
        return
    clash = conn.execute(text(
        f"SELECT {key.as_stored('d')} FROM {dst.qualified} d WHERE {span} AND EXISTS "
        f"(SELECT 1 FROM {src.qualified} s WHERE {key.expr('s')} = {key.expr('d')} "
        f"AND {embed(where or 'TRUE')}) ORDER BY {key.order_by('d')} LIMIT 1"), bounds).scalar()
    if clash is not None:
        names = key.columns[0] if len(key.columns) == 1 else "(" + ", ".join(key.columns) + ")"
        raise InvalidParams(
            f"target {dst.display} already has rows with keys the copy would write "
            f"(e.g. {names} = {shown(decode(clash))}); copy only fills keys the target does "
            "not have: "
            "delete those rows or exclude them with --where")


