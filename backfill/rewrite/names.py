"""Names of what a rewrite job creates, derived from its id and the table,
so the owner, every worker and an heir after a crash find the same objects
without storing them anywhere else. PostgreSQL truncates an identifier to
63 bytes; the names are cut here, on a character boundary, so the name the
job asks for is the name it gets."""

from __future__ import annotations

import hashlib

from framework.keys import quote

MAX_IDENTIFIER = 63  # bytes: NAMEDATALEN - 1


def _cut(name: str) -> str:
    data = name.encode()
    if len(data) <= MAX_IDENTIFIER:
        return name
    return data[:MAX_IDENTIFIER].decode(errors="ignore")


def prefix(job_id: int) -> str:
    return f"reorg_{job_id}_"


def _work(work_schema: str, job_id: int, what: str) -> str:
    """A table or function of the job in reorg's work schema (qualified, quoted)."""
    return f"{quote(work_schema)}.{quote(f'rewrite_{job_id}_{what}')}"


def _trigger(job_id: int, what: str) -> str:
    """A trigger of the job on the user's table (quoted): the prefix keeps it
    apart from the user's own triggers, which ``carry`` moves and these not."""
    return quote(f"{prefix(job_id)}{what}")


def shadow_table(job_id: int, table: str) -> str:
    """The shadow's bare name (unquoted), in T's schema."""
    return _cut(f"{prefix(job_id)}{table}")


def old_table(job_id: int, table: str) -> str:
    """T's bare name once the swap renamed it away (kept for --keep-old)."""
    return _cut(f"{prefix(job_id)}old_{table}")


def build_name(job_id: int, final: str) -> str:
    """An index or constraint of the shadow while T still holds ``final``
    (index names are unique per schema): renamed to ``final`` by the swap."""
    return f"{prefix(job_id)}b_{hashlib.md5(final.encode()).hexdigest()[:16]}"


def retired_name(job_id: int, name: str) -> str:
    """An index, constraint or statistics object of the old table, renamed
    away by the swap so the new table's can take ``name``."""
    return f"{prefix(job_id)}o_{hashlib.md5(name.encode()).hexdigest()[:16]}"


def log_table(work_schema: str, job_id: int) -> str:
    """The change log, in reorg's work schema (qualified, quoted)."""
    return _work(work_schema, job_id, "log")


def capture_function(work_schema: str, job_id: int) -> str:
    return _work(work_schema, job_id, "capture")


def capture_trigger(job_id: int) -> str:
    return _trigger(job_id, "capture")


def truncate_trigger(job_id: int) -> str:
    return _trigger(job_id, "truncate")


def truncate_function(work_schema: str, job_id: int) -> str:
    return _work(work_schema, job_id, "truncate")


def reverse_function(work_schema: str, job_id: int) -> str:
    return _work(work_schema, job_id, "reverse")


def reverse_trigger(job_id: int) -> str:
    return _trigger(job_id, "reverse")


def reverse_truncate_trigger(job_id: int) -> str:
    return _trigger(job_id, "reverse_truncate")


def reverse_truncate_function(work_schema: str, job_id: int) -> str:
    return _work(work_schema, job_id, "reverse_truncate")


def renamed_table(work_schema: str, job_id: int) -> str:
    """The swap's record of the old table's indexes renamed away (retired
    name -> original), for a revert to give them back their names."""
    return _work(work_schema, job_id, "renamed")


def plan_table(work_schema: str, job_id: int) -> str:
    """The job's plan (``shadow.Plan.to_params``), stored by prepare for every
    worker and the owner: made with the job's id, which submit does not know."""
    return _work(work_schema, job_id, "plan")


def replay_lock(job_id: int) -> int:
    """The advisory lock (one bigint) every replay of the job holds shared,
    and a verify's copy of a range again holds exclusive: a replay never
    interleaves with it."""
    digest = hashlib.md5(f"reorg rewrite replay {job_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def analyze_lock(job_id: int) -> int:
    """The advisory lock (one bigint) of the verify subtask taking the
    shadow's statistics: the others go on with their ranges meanwhile."""
    digest = hashlib.md5(f"reorg rewrite analyze {job_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def reverse_broken_table(work_schema: str, job_id: int) -> str:
    """One row once a write to the new table could not be mirrored into the
    old one: the old table is out of step and revert refuses."""
    return _work(work_schema, job_id, "reverse_broken")
