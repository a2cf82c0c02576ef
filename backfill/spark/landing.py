"""Landing a batch's Spark output in PostgreSQL: Arrow to the driver, CSV,
``COPY`` into a temporary staging table inside the merge transaction.

It needs no cleanup of staging rows (a Spark JDBC write into an unlogged
table would), and ``toArrow`` hands the driver columns where ``collect``
builds a Python object per row. What each stage costs per batch:
docs/benchmarks.md, "Where a ``backfill`` batch's time goes".

A temporary table is private to the merge session and emptied at commit, so
staging is isolated per (subtask, epoch, batch) by construction: a zombie's
rows never leave its own session, and an aborted batch leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import io
from typing import TYPE_CHECKING, Any

from backfill.tables import quote
from framework.keys import KeySpec

if TYPE_CHECKING:
    import pyarrow as pa


def staging_name(column_type: str, key: KeySpec) -> str:
    """One temporary table per session, column type and key shape: jobs
    writing the same type share it (it is empty outside a merge), so a
    long-lived pooled session does not collect one table per job."""
    shape = column_type + "|" + ",".join(key.types)
    return "reorg_stage_" + hashlib.md5(shape.encode()).hexdigest()[:12]


def stage_key_columns(key: KeySpec) -> list[str]:
    """The staged key's columns (``KeySpec.work_key``)."""
    return list(key.work_key().columns)


def stage_columns(key: KeySpec) -> list[str]:
    """Every column of a stage, in its order: the key's, the row version
    read (``ver``), the computed value (``new``)."""
    return [*stage_key_columns(key), "ver", "new"]


def create_staging_sql(column_type: str, key: KeySpec, name: str | None = None) -> str:
    """``name``: another than ``staging_name``'s (e.g. one per role)."""
    # ver is xid so the merge compares xmin = ver without a cast per row. The
    # key is staged in its own types, parsed by COPY from its text.
    staged = key.work_key()
    keys = ", ".join(f"{c} {t}" for c, t in zip(staged.columns, staged.types, strict=True))
    return (f"CREATE TEMP TABLE IF NOT EXISTS {quote(name or staging_name(column_type, key))} "
            f"({keys}, ver xid, new {column_type}) ON COMMIT DELETE ROWS")


def to_csv(table: pa.Table) -> bytes:
    """CSV as PostgreSQL's COPY reads it: NULL unquoted empty, strings quoted."""
    import pyarrow.csv as pacsv

    buf = io.BytesIO()
    pacsv.write_csv(table, buf, pacsv.WriteOptions(include_header=False))
    return buf.getvalue()


def copy_in(raw_conn: Any, column_type: str, columns: list[str], data: bytes,
            key: KeySpec, name: str | None = None) -> None:
    """COPY ``data`` into the staging table (``name``, else ``staging_name``'s)
    on psycopg connection ``raw_conn`` (the merge transaction's own connection)."""
    cols = ", ".join(columns)
    stage = quote(name or staging_name(column_type, key))
    with raw_conn.cursor() as cur, cur.copy(
            f"COPY {stage} ({cols}) FROM STDIN (FORMAT csv)") as copy:
        copy.write(data)
