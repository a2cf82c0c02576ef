"""Long statements a job starts outside its batch transactions: an index
build (``CREATE INDEX CONCURRENTLY``), ``VALIDATE CONSTRAINT``, ``ANALYZE``.
Each runs as long as the table is big, on a session of its own
(``session``), and may outlive the worker that started it: a worker killed
with -9, or frozen (SIGSTOP, a partition: a zombie whose socket stays open),
leaves its backend running the statement and holding its lock on the table.
DDL then queues behind that lock (a revert's, a cut-over's), and the
application's writes queue behind the DDL. So every such session is:

- tagged: its ``application_name`` names the job, the subtask and the lease
  epoch (``reorg-job-7-subtask-12-epoch-3``), so that reorg finds it and an
  operator reading ``pg_stat_activity`` sees whose it is;
- watching its client: ``client_connection_check_interval`` makes the
  backend notice within a second that its worker's socket closed (a kill
  -9) and end the statement by itself;
- ended by whoever comes next: the subtask's next lease holder ends the
  sessions of the subtask's earlier holders before its own statement
  (``session``), and the owner ends every session of the job before its DDL
  (a step's DDL, the cut-over, the revert: ``end_sessions``), when no
  subtask of the job may be running one any more, so any left is an orphan;
- never pooled: closed after its statement, with its tag and its timeouts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from framework.subtask import SubtaskContext

# How often a session's backend checks that its client is still there.
CLIENT_CHECK_INTERVAL = "1s"
# How long ending a session waits for its backend to exit (milliseconds):
# the DDL that follows must not find its lock still held.
END_WAIT_MS = 5000


def _prefix(job_id: int) -> str:
    return f"reorg-job-{job_id}-subtask-"


def tag(job_id: int, subtask_id: int, epoch: int) -> str:
    """The ``application_name`` of a long statement's session."""
    return f"{_prefix(job_id)}{subtask_id}-epoch-{epoch}"


def tagged_sql(job_id: int) -> str:
    """SQL: the ``pg_stat_activity`` rows of the job's sessions (for tests and
    operators: ``SELECT ... FROM pg_stat_activity WHERE <this>``)."""
    return f"starts_with(application_name, '{_prefix(job_id)}')"


def end_sessions(conn: Connection, job_id: int) -> int:
    """End every long statement's session of the job and wait for each to
    exit (the owner's, before its DDL). Returns how many it ended."""
    return _end(conn, "starts_with(application_name, :prefix)", {"prefix": _prefix(job_id)})


def _end_earlier_holders(conn: Connection, ctx: SubtaskContext) -> int:
    """End the subtask's sessions of lower epochs: its earlier holders', dead
    or fenced out. Never a higher epoch's: a zombie that wakes up must not end
    its successor's statement (its own is stopped by its lost lease)."""
    prefix = f"{_prefix(ctx.job.id)}{ctx.subtask_id}-epoch-"
    return _end(conn, "starts_with(application_name, :prefix) "
                      "AND substr(application_name, length(:prefix) + 1) ~ '^[0-9]+$' "
                      "AND CAST(substr(application_name, length(:prefix) + 1) AS bigint) "
                      "< :epoch",
                {"prefix": prefix, "epoch": ctx.epoch})


def _end(conn: Connection, where: str, params: dict[str, object]) -> int:
    ended = conn.execute(text(
        f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, {END_WAIT_MS})) "
        f"FROM pg_stat_activity WHERE {where} AND pid <> pg_backend_pid()"), params).scalar()
    return int(ended or 0)


@contextlib.contextmanager
def session(ctx: SubtaskContext, *, autocommit: bool = True) -> Iterator[Connection]:
    """A session for the long statements of ``ctx``'s subtask: tagged, its
    backend watching its client, no statement timeout (the pool renews the
    lease meanwhile); the subtask's earlier holders' sessions ended first; a
    hard stop cancels its statement (``SubtaskContext.cancel_on_stop``);
    closed afterwards, never pooled. ``autocommit``: outside any transaction
    (what CREATE INDEX CONCURRENTLY needs); else the caller begins one, e.g.
    to checkpoint in the statement's own transaction. Each caller sets the
    lock wait it wants (``lock_timeout``)."""
    with ctx.engine.connect() as conn:
        try:
            conn.execute(text(
                "SELECT set_config('application_name', :tag, false), "
                "set_config('client_connection_check_interval', :interval, false), "
                "set_config('statement_timeout', '0', false)"),
                {"tag": tag(ctx.job.id, ctx.subtask_id, ctx.epoch),
                 "interval": CLIENT_CHECK_INTERVAL})
            _end_earlier_holders(conn, ctx)
            conn.commit()  # the settings stay for the session
            ctx.raise_if_stopped()
            if autocommit:
                conn.execution_options(isolation_level="AUTOCOMMIT")
            with ctx.cancel_on_stop(conn):
                yield conn
        finally:
            # Closed, not pooled: a later holder would end it by its tag, and
            # it has no statement timeout.
            with contextlib.suppress(Exception):
                conn.invalidate()
