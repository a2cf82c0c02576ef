"""What the dashboard's pages show, each read bounded whatever the size of a
job: the newest jobs (``control.status``), one job's events, one page of its
subtasks, its rows/s over time (one row per bucket), and the nodes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from framework import control
from framework.db import Database
from framework.errors import InvalidParams
from framework.privileges import RUN_AS
from framework.records import DEFAULT_BATCH_ROWS
from framework.states import SubtaskState
from framework.store import subtask_pages
from framework.store import throughput as throughput_store

JOBS_SHOWN = 20
SUBTASKS_PER_PAGE = 50
CHART_BUCKETS = 60
# A job's parameters as people look for them: what it changes first.
PARAMS_FIRST = ("table", "set", "alter", "where", "select", "target", "column", "expr")
# Shown elsewhere on the page (who it runs as), or not the user's input.
PARAMS_HIDDEN = (RUN_AS, "work_schema", DEFAULT_BATCH_ROWS)


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
    """Every node, as ``reorg nodes --json`` shows them."""
    return control.nodes(db)


def throughput(db: Database, job_id: int) -> throughput_store.Throughput | None:
    with db.begin() as conn:
        return throughput_store.of_job(db, conn, job_id, CHART_BUCKETS)


def params_shown(params: dict[str, Any]) -> list[tuple[str, str]]:
    """A job's parameters (as ``control.status`` redacted them) as (name,
    text) pairs, what it changes first; unset ones left out."""
    shown = [k for k in PARAMS_FIRST if k in params]
    shown += sorted(k for k in params if k not in shown and k not in PARAMS_HIDDEN)
    return [(k, v if isinstance(v, str) else json.dumps(v))
            for k in shown if (v := params[k]) is not None and v != ""]
