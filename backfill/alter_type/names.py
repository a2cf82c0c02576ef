"""Names of what an ``alter-type`` job creates, derived from the job (its id,
the column), so the owner, every worker and an heir after a crash find the
same objects without storing them anywhere else."""

from __future__ import annotations

import hashlib

from backfill.schema import user_triggers
from backfill.tables import quote
from framework.records import Job

SHADOW_SUFFIX = "_reorg_new"
MAX_IDENTIFIER = 63  # PostgreSQL's NAMEDATALEN - 1


def shadow_column(column: str) -> str:
    return column + SHADOW_SUFFIX


def prefix(job: Job) -> str:
    """Every index and constraint the job makes starts with this."""
    return f"reorg_{job.id}_"


def trigger(job: Job) -> str:
    """Sorts after the user's triggers: it fires after them (``backfill.schema.user_triggers``)."""
    return quote(f"{user_triggers.PREFIX}{job.id}_alter_type")


def triggers(job: Job) -> tuple[str, ...]:
    """The trigger under its name and under the name of versions before
    ``trigger``'s (a job in flight across an upgrade): what a rollback or
    the cut-over drops."""
    return trigger(job), quote(f"reorg_{job.id}_alter_type")


def function(job: Job) -> str:
    """In reorg's own schema: the user's schema gets nothing but the shadow column."""
    return f"{quote(job.params['work_schema'])}.{quote(f'alter_type_{job.id}')}"


def not_null_check(job: Job) -> str:
    """The CHECK (shadow IS NOT NULL) that lets the cut-over's SET NOT NULL skip its scan."""
    return f"{prefix(job)}not_null"


def _hashed(job: Job, kind: str, original: str) -> str:
    return f"{prefix(job)}{kind}_{hashlib.md5(original.encode()).hexdigest()[:12]}"


def index_for(job: Job, original: str) -> str:
    """The index built on the shadow column to replace index ``original``."""
    return _hashed(job, "i", original)


def constraint_for(job: Job, original: str) -> str:
    """The CHECK / FOREIGN KEY on the shadow column replacing ``original``."""
    return _hashed(job, "c", original)


def shadow_mark(job: Job) -> str:
    """The comment prepare puts on the shadow column: a rollback drops a
    column of that name only if it carries this job's mark (never a column of
    the user's that took the name after the submit checked it)."""
    return f"reorg alter-type job {job.id}: shadow of {job.params['column']}"
