"""Rows that arrived after the split: a serial key keeps growing while a job
runs, and rows inserted past the last range's end would otherwise keep their
old value (or NULL in an added column) while the job says it succeeded.

Before a job may succeed, the owner (in the transaction that would advance
it) looks for keys past its last range, one index probe, and gives them
ranges of their own; the job runs on. A table with a steady stream of inserts
always has a new tail, and the job must end: after MAX_CATCH_UP_ROUNDS rounds
the rows still arriving are named in the job's event instead (the success
event, or the step's end). Not by a type whose trigger gives every inserted
row its value (``JobType.trigger_covers_inserts``): the first round ran after
its prepare, so what arrived after the last one was written by that trigger,
and nothing was missed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Connection

from framework import jobtype
from framework.db import Database
from framework.keyset_split import plan_split
from framework.records import Job
from framework.splitting import max_key
from framework.store import jobs, steps
from framework.store.owner_lease import OwnerTerm

MAX_CATCH_UP_ROUNDS = 3


@dataclass(frozen=True)
class Tail:
    added: bool  # ranges were added: the job runs on
    detail: str  # for the owner's log, or appended to the success event


def cover_tail(db: Database, conn: Connection, term: OwnerTerm, job: Job) -> Tail:
    if not job.key.has_tail:
        return Tail(False, "")  # its last range has no upper bound (framework.keys)
    last = steps.last_range(db, conn, job.id, job.step)
    newest = max_key(conn, job.target_table, job.key_column)
    covered = last.end_key if last else None
    assert covered is None or isinstance(covered, int)  # an integer key's ranges
    if newest is None or (covered is not None and newest < covered):
        return Tail(False, "")
    round_no = (last.catch_up_round if last else 0) + 1
    if round_no > MAX_CATCH_UP_ROUNDS:
        if jobtype.get(job.type).trigger_covers_inserts:
            return Tail(False, "")
        return Tail(False, f"; rows inserted with keys >= {covered} after the last of "
                           f"{MAX_CATCH_UP_ROUNDS} catch-up ranges were not processed")
    plan = plan_split(conn, job.target_table, job.key_column,
                      job.params.get("rows_per_subtask"), from_key=covered)
    steps.insert_ranges(db, conn, term, job.id, job.step, plan.ranges,
                        first_ordinal=last.ordinal + 1 if last else 0,
                        meta={"catch_up": round_no})
    jobs.add_to_estimate(db, conn, term, job.id, plan.row_count)
    return Tail(True, f"{plan.row_count} rows arrived past the last range; "
                      f"catch-up round {round_no} added {len(plan.ranges)} subtask(s)")
