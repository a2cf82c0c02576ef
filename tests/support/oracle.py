"""What a fault test checks afterwards: every row applied exactly once, the
committed batch rows summing to the table, and how much work was redone.

A counted job sets ``d = coalesce(d, 0) + 1`` (so a row applied twice shows
as 2) and draws one value of the sequence ``items_work`` per row it computes:
sequences are not transactional, so the draw counts rolled-back work too,
and ``draws - rows`` is the work the fault made the job redo."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from support.db import execute, make_items, scalar, wait_until
from support.fill import fill

COUNTED = "coalesce(d, 0) + 1 + 0 * nextval('items_work')::int"


def make_counted_items(db: Any, rows: int) -> None:
    make_items(db, rows)
    execute(db, "DROP SEQUENCE IF EXISTS items_work; CREATE SEQUENCE items_work")


def counted_fill(**knobs: Any):
    """``test-fill`` of the int column d, counting each application."""
    return fill(COUNTED, type="int", **knobs)


def work_done(db: Any) -> int:
    """Rows computed so far, committed or not."""
    return scalar(db, "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM items_work")


@dataclass
class Outcome:
    rows: int
    applied_once: int
    lost: int        # rows never applied
    twice: int       # rows applied more than once
    counted: int     # sum of the subtasks' committed batch rows
    redone: int      # rows computed again after a fault (rolled-back work)

    @property
    def table(self) -> tuple[int, int, int, int, int]:
        """What must not change once the job is over (``redone`` may: a healed
        zombie computes a batch it can no longer commit)."""
        return (self.rows, self.applied_once, self.lost, self.twice, self.counted)


def outcome(db: Any) -> Outcome:
    rows, once, lost, twice = (scalar(db, f"SELECT {e} FROM items") for e in (
        "count(*)", "count(*) FILTER (WHERE d = 1)", "count(*) FILTER (WHERE d IS NULL)",
        "count(*) FILTER (WHERE d > 1)"))
    counted = scalar(db, "SELECT coalesce(sum(row_count), 0) FROM (SELECT row_count FROM "
                         "{s}.background_subtask UNION ALL SELECT row_count FROM "
                         "{s}.background_subtask_history) x")
    return Outcome(rows, once, lost, twice, int(counted), work_done(db) - rows)


def assert_exactly_once(db: Any) -> Outcome:
    result = outcome(db)
    assert (result.lost, result.twice) == (0, 0), result
    assert result.applied_once == result.rows == result.counted, result
    return result


def holder(db: Any, subtask_id: int) -> str | None:
    return scalar(db, "SELECT exec_id FROM {s}.background_subtask WHERE id = :i UNION ALL "
                      "SELECT exec_id FROM {s}.background_subtask_history WHERE id = :i",
                  i=subtask_id)


def timed_takeover(db: Any, subtask_id: int, old: str, since: float,
                   timeout: float = 60) -> float:
    """Seconds from ``since`` (monotonic) until a node other than ``old`` holds
    ``subtask_id``."""
    wait_until(lambda: (h := holder(db, subtask_id)) is not None and h != old, timeout,
               f"another node to take subtask {subtask_id} from {old}", interval=0.05)
    return round(time.monotonic() - since, 2)


def timed(predicate: Callable[[], Any], since: float, timeout: float, message: str) -> float:
    wait_until(predicate, timeout, message, interval=0.05)
    return round(time.monotonic() - since, 2)


def report(fault: str, **figures: Any) -> None:
    """One line per measured fault, collected for docs/reliability.md
    (``pytest -s`` or the log shows them)."""
    print(f"\nRELIABILITY {fault}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
