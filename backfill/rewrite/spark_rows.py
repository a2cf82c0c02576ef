"""``rewrite --engine spark``: the job's one ``--set`` column computed by
Spark (the backfill data plane), for transforms SQL cannot express (a
Python function: ``--udf``).

Wherever the SQL engine runs ``INSERT INTO shadow SELECT <columns> FROM T
WHERE <rows>`` (a copy batch, a replay of logged keys, a verify's copy
again), this engine does it in two parts::

    Spark: SELECT *, xmin FROM T WHERE <rows> (JDBC, as the submitter) ─► --set
           on each row ─► Arrow ─► CSV
    the caller's transaction: COPY into a temporary stage (key, version read,
           value) ─► INSERT INTO shadow SELECT <columns>, stage.value FROM T
           JOIN stage ON the key AND T.xmin = the version read WHERE <rows>

Every other column comes from T's row in PostgreSQL, exact, as with the
SQL engine; Spark carries only the computed value. A row is written only
where T's row is still the version Spark read (``xmin``, as ``backfill``'s
merge): a row written since then has its key in the change log (the
capture trigger was on T before any read), so a replay writes it later from
its newer version; a row deleted since is not written. So the shadow never
holds a value computed from a row version other than its own.

The replay's own rows (``Capture.replay``) go through here too, on the
workers that run the catch-up and the verify. The swap's last replay runs
on the owner, under a lock that keeps writes out but lets Spark's reads in
(``swap``: EXCLUSIVE on T before ACCESS EXCLUSIVE). Spark's sessions give
up on a lock after the caller's lock_timeout (the swap's, a worker's)
rather than queue behind a lock request queued behind the caller's; that,
a lost connection or a JVM that exited is retried
(``failures.as_batch_error``). While Spark computes, the caller's
transaction is idle: its idle limit is raised to ``SPARK_IDLE_LIMIT`` for
that transaction (the workers' own is a third of a lease: seconds)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from framework.errors import InvalidParams
from framework.keys import quote

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType

    from backfill.rewrite.shadow import Plan
    from backfill.spark.transform import Transform

# Spark's data plane is imported where a job runs on Spark, never with this
# module: the SQL engine's planning and workers import it for ``spark_set_of``.

ENGINES = ("sql", "spark")
SPARK_IDLE_LIMIT = "30s"
_STAGED = "__reorg_s_"  # the stage's columns as the copy's join names them
_types: dict[tuple[int, str], Any] = {}  # (session, PostgreSQL type) -> Spark type
_types_lock = threading.Lock()
_types_hooked = False


@dataclass(frozen=True)
class SparkSet:
    """The column Spark computes: ``--set column=expr`` with ``--engine spark``."""

    column: str  # the shadow's column (unquoted)
    expr: str  # Spark SQL over T's row
    pg_type: str  # the shadow column's type
    udf: str | None = None  # module:function, callable from ``expr``

    @property
    def transform(self) -> Transform:
        from backfill.spark.transform import Transform

        return Transform(self.column, self.expr, self.udf)


def check_udf(udf: str) -> None:
    """``--udf``: a function a submitter may name (InvalidParams otherwise)."""
    from backfill.spark.transform import UdfError, load_udf

    try:
        load_udf(udf)
    except UdfError as exc:
        raise InvalidParams(str(exc)) from None


def start_first(conn: Connection, table: str) -> None:
    """Spark started before ``conn``'s checks open their transaction
    (``backfill.spark.validation``)."""
    from backfill.spark.validation import start_spark_first

    start_spark_first(conn, table)


def warm_up() -> None:
    """This process's SparkSession, started unless it runs."""
    from backfill.spark.warmup import start_worker_spark

    start_worker_spark()


def spark_set_of(params: dict[str, Any], plan: Plan) -> SparkSet | None:
    """The job's Spark column, or None for the SQL engine."""
    if params.get("engine", "sql") != "spark":
        return None
    [(column, expr)] = params["sets"]
    return SparkSet(column, expr, dict(plan.shape)[column], params.get("udf"))


def allow_idle(conn: Connection) -> None:
    """The caller's transaction may sit idle while Spark computes (see the
    module), up to ``SPARK_IDLE_LIMIT``."""
    conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = '{SPARK_IDLE_LIMIT}'")


def fill(conn: Connection, plan: Plan, spark_set: SparkSet, role: str | None, where: str,
         order_by: str = "", lock_timeout: str | None = None) -> int:
    """Write T's rows matching ``where`` (SQL over T's columns) into the
    shadow, the Spark column computed by Spark reading as ``role``, in the
    caller's transaction (see the module); the rows written.
    ``lock_timeout``: Spark's sessions wait no longer for a lock on T."""
    from backfill.spark import landing

    allow_idle(conn)
    rows = computed(conn, plan, spark_set, role, where, lock_timeout)
    raw = conn.connection.driver_connection
    key, pg_type = plan.key, spark_set.pg_type
    name = stage_name(pg_type, key.types, role)
    conn.exec_driver_sql(landing.create_staging_sql(pg_type, key, name))
    conn.exec_driver_sql(f"TRUNCATE {quote(name)}")  # rows of an earlier fill, same transaction
    if not rows.num_rows:
        return 0
    landing.copy_in(raw, pg_type, landing.stage_columns(key), landing.to_csv(rows), key, name)
    statement = insert_statement(plan, spark_set, quote(name), where, order_by)
    return int(raw.execute(statement).rowcount)  # type: ignore[union-attr]


def stage_name(pg_type: str, key_types: tuple[str, ...] | list[str], role: str | None) -> str:
    """The session's temporary stage for a column type, a key and a role:
    it runs as the submitter (the caller's role), who owns the stage it
    made, so another submitter's job on the same pooled session needs its
    own (and ``backfill``'s, made by the worker's role, is not this one)."""
    import hashlib

    shape = "|".join([pg_type, *key_types, role or ""])
    return "reorg_rewrite_stage_" + hashlib.md5(shape.encode(), usedforsecurity=False).hexdigest()[:12]


def insert_statement(plan: Plan, spark_set: SparkSet, stage: str, where: str,
                     order_by: str = "") -> str:
    """The shadow's rows from T's and the stage's values, where T's row is
    still the version read. The stage's columns are renamed (``_STAGED``):
    the copy's expressions name T's columns unqualified."""
    from backfill.spark import landing

    staged = landing.stage_key_columns(plan.key)
    renamed = ", ".join(f"{c} AS {quote(_STAGED + c)}" for c in landing.stage_columns(plan.key))
    match = " AND ".join(f"{plan.table}.{quote(c)} = s.{quote(_STAGED + k)}"
                         for c, k in zip(plan.key.columns, staged, strict=True))
    columns = ", ".join([*(quote(c.name) for c in plan.columns), quote(spark_set.column)])
    values = ", ".join([*(c.value for c in plan.columns), f"s.{quote(_STAGED + 'new')}"])
    overriding = " OVERRIDING SYSTEM VALUE" if plan.overriding else ""
    return (f"INSERT INTO {plan.shadow} ({columns}){overriding} SELECT {values} "
            f"FROM {plan.table} JOIN (SELECT {renamed} FROM {stage}) s ON {match} "
            f"AND {plan.table}.xmin = s.{quote(_STAGED + 'ver')} WHERE {where}{order_by}")


def computed(conn: Connection, plan: Plan, spark_set: SparkSet, role: str | None, where: str,
             lock_timeout: str | None = None) -> pa.Table:
    """T's rows matching ``where`` as the stage takes them (key, version
    read, value), computed by Spark on the driver's session. Its reads
    wait for a lock on T no longer than ``lock_timeout``, by default the
    caller's session's. A failure a retry may pass raises RetryableError
    (``failures.as_batch_error``)."""
    from backfill.spark import failures, session
    from backfill.spark.jdbc import jdbc_target, read_query
    from backfill.spark.keyset_read import text_columns

    spark = session.get_spark()
    jdbc = jdbc_target(conn.engine.url, role)
    props = jdbc.read_props()
    bound = lock_timeout or str(conn.exec_driver_sql("SHOW lock_timeout").scalar())
    if bound != "0":
        # The caller's transaction may hold a lock on T (a verify's read, a
        # key scan; the swap's), and a lock queued behind it (a DDL's) would
        # hold Spark's reads for ever: the caller waits for Spark, Spark for
        # the queued lock, that lock for the caller, a wait PostgreSQL cannot
        # see. A startup option, so every session of the read has it: the
        # driver's schema query runs no sessionInitStatement.
        props["options"] = f"{props.get('options', '')} -c lock_timeout={bound}".strip()
    try:
        frame = spark.read.jdbc(jdbc.url, read_query(plan.table, where,
                                                     columns=text_columns(plan.key)),
                                properties=props)
        target = spark_type(spark, conn, spark_set.pg_type)
        transform = spark_set.transform
        transform.register(spark, target)
        return transform.output(frame, plan.key, target).toArrow()
    except Exception as exc:
        raise failures.as_batch_error(exc, session.alive(spark)) from exc


def spark_type(spark: SparkSession, conn: Connection, pg_type: str) -> DataType:
    """Spark's type of PostgreSQL's ``pg_type`` as its JDBC source maps it
    (a probe of no table: it takes no lock, so it runs under the swap's)."""
    from backfill.spark.jdbc import jdbc_target, schema_probe
    from backfill.spark.session import on_session_stop

    global _types_hooked
    with _types_lock:
        if not _types_hooked:  # a new session's id may be a stopped one's
            on_session_stop(_types.clear)
            _types_hooked = True
        known = _types.get((id(spark), pg_type))
    if known is None:
        probe = schema_probe(spark, jdbc_target(conn.engine.url),
                             f"SELECT CAST(NULL AS {pg_type}) AS v")
        known = probe.schema["v"].dataType
        with _types_lock:
            _types[(id(spark), pg_type)] = known
    return known


def check(conn: Connection, plan: Plan, spark_set: SparkSet) -> None:
    """At submit (Spark started before the checks' transaction): the
    expression analysed on T's columns as Spark reads them, its type
    against the column's, then computed on sample rows and landed in a
    stage, rolled back (``backfill.spark.validation.check_on_sample``).
    InvalidParams, one line, otherwise."""
    from backfill.spark import compat
    from backfill.spark.jdbc import jdbc_target, read_query
    from backfill.spark.keyset_read import text_columns
    from backfill.spark.quiet import quiet_analysis_errors
    from backfill.spark.session import get_validation_spark
    from backfill.spark.validation import DRY_RUN_ROWS, check_on_sample

    spark = get_validation_spark()
    jdbc = jdbc_target(conn.engine.url)  # at submit: the submitter's own connection
    target = spark_type(spark, conn, spark_set.pg_type)
    if not compat.landable(target):
        raise InvalidParams(f"--engine spark cannot write column {spark_set.column} "
                            f"({spark_set.pg_type}) yet; leave out --engine spark and give "
                            "the --set as SQL")
    sample = spark.read.jdbc(jdbc.url, read_query(plan.table, None, limit=DRY_RUN_ROWS,
                                                  columns=text_columns(plan.key)),
                             properties=jdbc.read_props())
    with quiet_analysis_errors():
        check_on_sample(conn, sample, spark_set.transform, target, spark_set.pg_type, plan.key,
                        f"{plan.schema}.{plan.table_name}", None)
