"""Who a job's SQL runs as: its submitter, never more (docs/security.md).

A job records the role that submitted it (``current_user`` at submit, in
``params["run_as"]``). Workers connect as a role of their own; every
statement built from user input (``--set``, ``--where``, ``--select``) and
every DDL on the user's table runs inside ``as_role(conn, run_as)``, i.e.
under ``SET LOCAL ROLE`` in the batch's transaction, so PostgreSQL checks the
submitter's privileges, not the worker's. The framework's own statements
(claim, checkpoint, before-images, restore) run as the worker.

For that the worker's role must be allowed to ``SET ROLE`` to the submitter
(``GRANT submitter TO worker``); a job whose submitter it may not become is
refused: at submit when a live worker's role is known not to qualify, and by
the owner before it touches the table.

``SET ROLE`` is not a sandbox against code the submitter wrote: a function
of theirs can switch the role back to the session's (the worker's). So
``expressions`` refuses the built-ins that switch roles or run SQL text, the
statement's role is checked again before its transaction commits, and the
worker role itself holds no more than the reorg schema and the target tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from framework.errors import InvalidParams
from framework.records import Job

# The job parameter naming the role a job's user SQL runs as.
RUN_AS = "run_as"
DOCS = "docs/security.md"


class RoleChanged(RuntimeError):
    """User SQL switched the role it ran under: its transaction must not commit."""


def quote_role(role: str) -> str:
    return '"' + role.replace('"', '""') + '"'


def current_role(conn: Connection) -> str:
    return str(conn.execute(text("SELECT current_user")).scalar())


def session_role(conn: Connection) -> str:
    """The role the connection logged in as, read once per pooled connection."""
    info = conn.connection.info
    if "reorg_session_role" not in info:
        info["reorg_session_role"] = str(conn.execute(text("SELECT session_user")).scalar())
    return str(info["reorg_session_role"])


def run_as(job: Job) -> str | None:
    """The role the job's user SQL runs as; None for a job submitted before
    roles were recorded (it runs as the worker, as it always did)."""
    role = job.params.get(RUN_AS)
    return str(role) if role else None


@contextmanager
def as_role(conn: Connection, role: str | None) -> Iterator[None]:
    """Run the block's statements on ``conn`` as ``role`` (inside the open
    transaction; back to the worker's role after it). Raises RoleChanged if
    the block left another role in force: something in it switched roles."""
    if role is None or role == session_role(conn):
        # The submitter is the role the worker logged in as: nothing to
        # switch (and nothing above it to switch back to), no round trips.
        yield
        return
    conn.execute(text(f"SET LOCAL ROLE {quote_role(role)}"))
    yield
    now = current_role(conn)
    if now != role:
        raise RoleChanged(
            f"the job's SQL switched its role from {role} to {now}; refused, "
            "nothing committed: a job's SQL runs with its submitter's privileges only")
    conn.execute(text("SET LOCAL ROLE NONE"))


def can_become(conn: Connection, role: str) -> bool:
    """Whether this session may ``SET ROLE`` to ``role`` (tried in a savepoint,
    which is what PostgreSQL itself will check, in every version)."""
    try:
        with conn.begin_nested() as savepoint:
            conn.execute(text(f"SET LOCAL ROLE {quote_role(role)}"))
            savepoint.rollback()
        return True
    except Exception:
        return False


def check_can_run(conn: Connection, job: Job) -> None:
    """Owner, before it touches the table: the job's submitter must be a role
    the workers may become; else one line saying what to grant."""
    role = run_as(job)
    if role is None or can_become(conn, role):
        return
    me = current_role(conn)
    raise InvalidParams(
        f"job {job.id} was submitted by role {role}, and reorg's workers connect as "
        f"{me}, which may not act as {role}: run GRANT {quote_role(role)} TO "
        f"{quote_role(me)} (see {DOCS}), or submit as a role the workers may act as")


def check_workers_can_run_as(conn: Connection, role: str) -> None:
    """Submit: refuse at once when a live worker's database role may not act
    as ``role`` (its jobs would be refused by the owner anyway)."""
    refusing = conn.execute(text("""
        SELECT DISTINCT usename FROM pg_stat_activity
        WHERE datname = current_database() AND application_name IN ('reorg-worker', 'reorg-owner')
          AND usename IS NOT NULL AND usename <> :role
          AND NOT pg_has_role(usename, :role, 'MEMBER')
        ORDER BY usename"""), {"role": role}).scalars().all()
    if refusing:
        names = ", ".join(refusing)
        raise InvalidParams(
            f"reorg's workers connect as {names}, which may not act as your role {role}, "
            f"and a job's SQL runs as its submitter: have an admin run GRANT "
            f"{quote_role(role)} TO {quote_role(refusing[0])} (see {DOCS}), or submit as "
            "a role the workers may act as")


_PRIVILEGE_FIX = {
    "SELECT": "read", "UPDATE": "update", "INSERT": "insert into", "DELETE": "delete from",
}


def check_table_privileges(conn: Connection, table: str, display: str,
                           privileges: tuple[str, ...], role: str | None = None) -> None:
    """``role`` (default: the session's) holds every one of ``privileges`` on
    ``table`` (quoted); else one line naming the missing GRANT."""
    who = role or current_role(conn)
    for privilege in privileges:
        held = conn.execute(text("SELECT has_table_privilege(:r, CAST(:t AS regclass), :p)"),
                            {"r": who, "t": table, "p": privilege}).scalar()
        if not held:
            raise InvalidParams(
                f"role {who} may not {_PRIVILEGE_FIX.get(privilege, privilege)} {display}, and "
                f"a job runs with its submitter's privileges: GRANT {privilege} ON {display} "
                f"TO {quote_role(who)}, or submit as a role that may")


def check_owns_table(conn: Connection, table: str, display: str, why: str) -> None:
    """The session's role owns ``table`` (or is a member of its owner), as
    PostgreSQL demands for ALTER TABLE; ``why`` says which option needs it."""
    owner, may = conn.execute(text("""
        SELECT pg_get_userbyid(relowner), pg_has_role(current_user, relowner, 'USAGE')
        FROM pg_class WHERE oid = CAST(:t AS regclass)"""), {"t": table}).one()
    if not may:
        raise InvalidParams(
            f"{why} alters {display}, which only its owner {owner} may do, and a job runs "
            f"with its submitter's privileges: submit as {owner} (or a member of it)")


def grant_to_submitter(conn: Connection, job: Job, privilege: str, relation: str) -> None:
    """Let the job's submitter write a work table of the job's (e.g. its
    before-images, written by the batch's statement, which runs as the submitter)."""
    role = run_as(job)
    if role is not None and role != current_role(conn):
        conn.execute(text(f"GRANT {privilege} ON {relation} TO {quote_role(role)}"))


def recorded(params: dict[str, Any], role: str) -> dict[str, Any]:
    """``params`` with the submitting role recorded (whatever the input said)."""
    return {**params, RUN_AS: role}
