"""The revert step's batch loop, shared by the job types that restore data
range by range (DESIGN 13): a revert subtask restores ``[curr_key, end_key)``
a batch at a time, each batch's statements and its fenced checkpoint in one
transaction (DESIGN 3), so a killed worker's successor resumes from
``curr_key`` and no restore batch applies twice.
"""

from __future__ import annotations

import time

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from framework import faults
from framework.jobtype import SubtaskContext


def restore_in_batches(ctx: SubtaskContext, engine: Engine, *, paced_by: tuple[str, str],
                       statements: list[str]) -> None:
    """Run ``statements`` (each binds ``lo`` and ``hi``) over ctx's range in
    batches of at most ``batch_rows`` keys of ``paced_by`` (a relation and its
    key column, both quoted): bounded statements however large the range."""
    relation, key = paced_by
    curr = ctx.curr_key
    while curr < ctx.end_key:
        ctx.raise_if_stopped()
        started = time.monotonic()
        # A hard stop (lease lost) cancels the running statement: the batch
        # rolls back at once.
        with engine.begin() as conn, ctx.cancel_on_stop(conn):
            upper = next_upper(conn, relation, key, curr, ctx.end_key, ctx.job.batch_rows)
            bounds = {"lo": curr, "hi": upper}
            restored = sum(conn.execute(text(stmt), bounds).rowcount for stmt in statements)
            faults.hit("worker.in_restore_batch")
            ctx.checkpoint(conn, upper, restored)
        curr = upper
        ctx.throttle(restored, time.monotonic() - started)


def next_upper(conn: Connection, relation: str, key: str, curr: int, end: int, n: int) -> int:
    """The exclusive upper key of the batch from ``curr``: past the ``n``-th key
    of ``relation`` in ``[curr, end)``, or ``end`` when fewer are left."""
    last = conn.execute(
        text(f"SELECT {key} FROM {relation} WHERE {key} >= :curr AND {key} < :end "
             f"ORDER BY {key} OFFSET :skip LIMIT 1"),
        {"curr": curr, "end": end, "skip": max(n, 1) - 1},
    ).scalar()
    return end if last is None else last + 1
