"""What the dashboard's pages show, each read bounded whatever the size of a
job: the newest jobs (``control.status``), one job's events, one page of its
subtasks, and the nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from framework import control
from framework.db import Database
from framework.errors import InvalidParams
from framework.states import SubtaskState
from framework.store import nodes as node_store
from framework.store import owner_lease, subtask_pages

JOBS_SHOWN = 20
SUBTASKS_PER_PAGE = 50


def jobs(db: Database) -> list[dict[str, Any]]:
    """The newest jobs with their progress, as ``reorg status`` shows them."""
    return control.status(db, None, JOBS_SHOWN)


def job(db: Database, job_id: int) -> dict[str, Any]:
    """One job's progress; InvalidParams when there is no such job."""
    return control.status(db, job_id, 1)[0]


def events(db: Database, job_id: int) -> list[dict[str, Any]]:
    return control.events(db, job_id)


@dataclass(frozen=True)
class SubtaskPage:
    rows: list[dict[str, Any]]
    state: SubtaskState | None
    # (step, ordinal) of the last row when more follow: the next page's ``after``.
    next_after: tuple[int, int] | None


def parse_after(value: str | None) -> tuple[int, int] | None:
    """``STEP.ORDINAL`` (as the page's next link writes it) -> (step, ordinal)."""
    if not value:
        return None
    step, _, ordinal = value.partition(".")
    try:
        return int(step), int(ordinal)
    except ValueError:
        raise InvalidParams(f"after={value!r} is not STEP.ORDINAL, e.g. after=1.49") from None


def parse_state(value: str | None) -> SubtaskState | None:
    if not value:
        return None
    try:
        return SubtaskState(value)
    except ValueError:
        known = ", ".join(s.value for s in SubtaskState)
        raise InvalidParams(f"state={value!r} is not a subtask state; one of {known}") from None


def subtasks(db: Database, job_id: int, *, after: tuple[int, int] | None,
             state: SubtaskState | None) -> SubtaskPage:
    with db.begin() as conn:
        # One more than shown: whether a next page exists, without counting.
        rows = subtask_pages.page_of_job(db, conn, job_id, after=after, state=state,
                                         limit=SUBTASKS_PER_PAGE + 1)
    shown = rows[:SUBTASKS_PER_PAGE]
    more = len(rows) > SUBTASKS_PER_PAGE
    return SubtaskPage(shown, state, (shown[-1]["step"], shown[-1]["ordinal"]) if more else None)


def nodes(db: Database) -> list[dict[str, Any]]:
    """Every node, with its heartbeat age and, for the owner, its revision."""
    with db.begin() as conn:
        rows = node_store.list_all(db, conn)
        revision = owner_lease.current(db, conn)["revision"]
    for r in rows:
        r["heartbeat_age"] = float(r["heartbeat_age"])
        r["owner_revision"] = revision if r["is_owner"] else None
    return rows
