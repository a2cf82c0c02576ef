"""PostgreSQL over JDBC: a ``postgresql://`` URL as Spark's JDBC source sees
it, and the range reads every batch is made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from backfill.expressions import embed
from backfill.spark.session import DRIVER_CLASS
from framework.privileges import quote_role

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The row version read with the data: the inserting/updating transaction's id.
# Any later write to the row gives it a new xmin, so "xmin unchanged" means
# "the row is exactly what Spark read" (DESIGN 9).
VERSION_COLUMN = "__reorg_ver"
VERSION_SQL = f"xmin::text::bigint AS {VERSION_COLUMN}"

# libpq URL parameters with the same name and meaning in pgJDBC.
_PASS_THROUGH = {"sslmode", "sslrootcert", "sslcert", "sslkey", "options", "application_name",
                 "connect_timeout"}


SPARK_APPLICATION_NAME = "reorg-spark"


class JdbcUrlError(ValueError):
    pass


@dataclass(frozen=True)
class JdbcTarget:
    url: str  # never holds credentials: they are properties
    # Holds the password: never in a repr, so never in a log line or error.
    properties: dict[str, str] = field(default_factory=dict, repr=False)

    # The role a job's reads run as: its submitter (framework.privileges), so
    # a --where, or a read of a table, has the submitter's privileges only.
    role: str | None = None

    def __repr__(self) -> str:
        shown = {k: ("***" if k == "password" else v) for k, v in self.properties.items()}
        return f"JdbcTarget(url={self.url!r}, properties={shown!r}, role={self.role!r})"

    def session_props(self) -> dict[str, str]:
        """Every JDBC session starts as the job's role; jit off because a
        batch query is cheap and JIT compiling it would cost more than running it."""
        init = "SET jit = off"
        if self.role:
            init += f"; SET ROLE {quote_role(self.role)}"
        return {**self.properties, "sessionInitStatement": init}

    def read_props(self, fetch_rows: int = 10_000) -> dict[str, str]:
        # Large fetches cut round trips; a server-side prepared statement from
        # the first execution gets binary results, ~10% less CPU to decode than text.
        return {**self.session_props(), "fetchsize": str(fetch_rows), "prepareThreshold": "-1"}

    def write_props(self, batch_rows: int = 10_000) -> dict[str, str]:
        return {**self.properties, "batchsize": str(batch_rows), "reWriteBatchedInserts": "true"}


def jdbc_target(url: Any, role: str | None = None) -> JdbcTarget:
    """``postgresql[+driver]://user:pw@host:port/db?sslmode=..`` (a string or a
    SQLAlchemy URL) as a JDBC URL plus connection properties; its sessions
    run as ``role`` when given (a job's submitter)."""
    parsed = make_url(url) if isinstance(url, str) else url
    if not parsed.drivername.startswith("postgres"):
        raise JdbcUrlError(f"not a PostgreSQL URL: {parsed.drivername}://...; use postgresql://")
    query = dict(parsed.query)
    host = parsed.host or query.pop("host", None) or "localhost"
    if isinstance(host, tuple) or str(host).startswith("/"):
        raise JdbcUrlError(
            f"JDBC cannot use the unix socket {host}; give the database URL a TCP host, "
            "e.g. postgresql://user@127.0.0.1:5432/db")
    # Named like reorg's own sessions (framework.db: reorg-worker, ...), so
    # the --max-active-sessions load signal leaves a job's own reads out.
    props = {"driver": DRIVER_CLASS, "ApplicationName": SPARK_APPLICATION_NAME}
    if parsed.username:
        props["user"] = parsed.username
    if parsed.password:
        props["password"] = str(parsed.password)
    for key, value in query.items():
        if key in _PASS_THROUGH:
            props["connectTimeout" if key == "connect_timeout" else key] = str(value)
            if key == "application_name":
                props["ApplicationName"] = props.pop(key)
    jdbc = f"jdbc:postgresql://{host}:{parsed.port or 5432}/{parsed.database or ''}"
    return JdbcTarget(jdbc, props, role)


def read_query(table: str, where: str | None, extra: str | None = None,
               limit: int | None = None, columns: str = "") -> str:
    """``columns``: more of the select list (``, expr AS name ...``), e.g. the
    text of a key of any type (``keyset_read.text_columns``)."""
    # ``where`` is the user's (checked by expressions.one_expression); embedded,
    # it can neither end its parenthesis nor comment out what follows.
    conds = " AND ".join(embed(c) for c in (where, extra) if c) or "TRUE"
    tail = f" LIMIT {int(limit)}" if limit is not None else ""
    return f"(SELECT *, {VERSION_SQL}{columns} FROM {table} WHERE {conds}{tail}) reorg_src"


def read_base(spark: SparkSession, target: JdbcTarget, table: str,
              where: str | None = None) -> DataFrame:
    """All rows matching ``where``, with versions, as a lazily read DataFrame.

    Built once per subtask: creating a JDBC DataFrame costs a connection and a
    schema query, which at ~20 ms a batch is most of PostgreSQL's fixed cost.
    Each batch narrows it with ``pipeline.key_between``; Spark pushes that into
    the SQL.
    """
    return spark.read.jdbc(target.url, read_query(table, where), properties=target.read_props())


def schema_probe(spark: SparkSession, target: JdbcTarget, select_sql: str) -> DataFrame:
    """An empty DataFrame with the Spark types of ``select_sql``'s columns (one
    catalogue round trip, no rows read)."""
    return spark.read.jdbc(target.url, f"({select_sql} LIMIT 0) reorg_probe",
                           properties=target.session_props())
