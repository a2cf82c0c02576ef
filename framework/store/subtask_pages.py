"""One page of a job's subtasks, live and moved to history, for people who
browse a job (``reorg dashboard``).

Pages follow the key ``(step, ordinal)`` instead of an offset: each page is an
index range scan on both tables ((job_id, step, ordinal) on the live one,
(job_id, ordinal) on history), so page 2,000 of a 100,000-subtask job costs
what page 1 does.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from framework.db import Database
from framework.states import SubtaskState

_COLUMNS = ("id, step, ordinal, state, start_key, end_key, curr_key, exec_id, attempts, "
            "row_count, error, started_at, finished_at")


def page_of_job(
    db: Database, conn: Connection, job_id: int, *, after: tuple[int, int] | None = None,
    state: SubtaskState | None = None, limit: int = 50,
) -> list[dict[str, Any]]:
    """Up to ``limit`` subtasks of the job after ``after`` = (step, ordinal), in
    step and range order, optionally only those in ``state``; ``moved_at`` is
    None for a live one. One statement, so one snapshot: a history move
    meanwhile can neither hide nor repeat a subtask."""
    # A fixed fragment, not an ``IS NULL OR`` parameter: the planner then keeps
    # the index range scan whatever plan it caches for the statement.
    only = "AND state = :state" if state is not None else ""
    where = f"job_id = :job_id AND (step, ordinal) > (:step, :ordinal) {only}"
    after_step, after_ordinal = after if after is not None else (-1, -1)
    rows = conn.execute(
        db.sql(f"""
            SELECT * FROM (
                (SELECT {_COLUMNS}, NULL::timestamptz AS moved_at
                 FROM {{s}}.background_subtask WHERE {where}
                 ORDER BY step, ordinal LIMIT :limit)
                UNION ALL
                (SELECT {_COLUMNS}, moved_at
                 FROM {{s}}.background_subtask_history WHERE {where}
                 ORDER BY step, ordinal LIMIT :limit)
            ) page ORDER BY step, ordinal LIMIT :limit"""),
        {"job_id": job_id, "step": after_step, "ordinal": after_ordinal,
         "state": str(state) if state is not None else None, "limit": limit},
    ).mappings()
    return [dict(r) for r in rows]
