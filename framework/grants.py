"""The GRANT statements of a least-privilege installation (docs/security.md).

Three kinds of role:

- the **admin** role owns the system tables: it runs ``reorg db upgrade``;
- the **worker** role is what ``reorg worker`` connects as: it reads and
  writes the system tables, creates a job's work tables in the system schema,
  reads and writes the target tables, and may ``SET ROLE`` to each user role
  (a job's SQL runs as its submitter, ``framework.privileges``). Create it
  NOINHERIT, so that membership gives it no privilege of a user's, only the
  right to act as that user while it runs that user's SQL;
- **user** roles run ``reorg submit/status/cancel``: they read the system
  tables and write jobs and their events.

``grant_script`` writes them as SQL a DBA can paste into psql; each section
says which role may run it.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.privileges import quote_role

WORKER_TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
WORKER_SEQUENCE_PRIVILEGES = "USAGE, SELECT, UPDATE"
# What users write: a submit inserts the job and its event (and deletes them
# again when the owner rejects its input); cancel, pause, resume and alter
# update the job and add an event.
USER_WRITTEN_TABLES = ("jobs", "job_events")


@dataclass(frozen=True)
class GrantPlan:
    schema: str  # the system schema
    admin_role: str  # owner of the system tables
    worker_role: str
    user_roles: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()  # target tables as the user writes them, e.g. public.items


def grant_script(plan: GrantPlan) -> str:
    """The statements, with a comment before each section saying who runs it."""
    s, w = quote_role(plan.schema), quote_role(plan.worker_role)
    default = f"ALTER DEFAULT PRIVILEGES FOR ROLE {quote_role(plan.admin_role)} IN SCHEMA {s}"
    lines = [
        f"-- As {plan.admin_role} (owner of schema {plan.schema}, runs `reorg db upgrade`) "
        "or a superuser:",
        "-- the worker role reads and writes the system tables and keeps jobs' work tables.",
        f"GRANT USAGE, CREATE ON SCHEMA {s} TO {w};",
        f"GRANT {WORKER_TABLE_PRIVILEGES} ON ALL TABLES IN SCHEMA {s} TO {w};",
        f"GRANT {WORKER_SEQUENCE_PRIVILEGES} ON ALL SEQUENCES IN SCHEMA {s} TO {w};",
        # The functions of jobs in the schema (add-column's); PUBLIC has EXECUTE unless revoked.
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {w};",
        f"{default} GRANT {WORKER_TABLE_PRIVILEGES} ON TABLES TO {w};",
        f"{default} GRANT {WORKER_SEQUENCE_PRIVILEGES} ON SEQUENCES TO {w};",
    ]
    for user in plan.user_roles:
        u = quote_role(user)
        written = ", ".join(f"{s}.{quote_role(t)}" for t in USER_WRITTEN_TABLES)
        lines += [
            f"-- user {user}: reorg submit, status, wait, cancel, pause, resume, alter.",
            f"GRANT USAGE ON SCHEMA {s} TO {u};",
            f"GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {u};",
            f"GRANT INSERT, UPDATE, DELETE ON {written} TO {u};",
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {u};",
            f"{default} GRANT SELECT ON TABLES TO {u};",
            f"{default} GRANT USAGE ON SEQUENCES TO {u};",
        ]
    if plan.user_roles:
        lines.append("-- As a role with ADMIN OPTION on each user role (or a superuser): the "
                     "workers run each job's SQL as its submitter (SET ROLE).")
        lines += [f"GRANT {quote_role(u)} TO {w};" for u in plan.user_roles]
    if plan.tables:
        lines.append("-- As each table's owner: the workers read and write the rows "
                     "(submitters need their own grants too; a job never exceeds them).")
        lines += [f"GRANT {WORKER_TABLE_PRIVILEGES} ON TABLE {_table(t)} TO {w};"
                  for t in plan.tables]
    return "\n".join(lines) + "\n"


def statements(script: str) -> list[str]:
    """The script's statements, comments left out (one a line, as written)."""
    return [line.rstrip(";") for line in script.splitlines()
            if line.strip() and not line.startswith("--")]


def _table(name: str) -> str:
    """``schema.table`` (or ``table``) quoted part by part."""
    return ".".join(quote_role(part) for part in name.split(".", 1))
