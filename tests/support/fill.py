"""``test-fill``: the small job type the framework's own tests run, so they
depend on no built-in job type (``backfill/``).

It adds a column and fills it from a SQL expression, range by range: each
batch's UPDATE commits with its fenced checkpoint (DESIGN 3), and since the
column is the job's own, rollback drops it (no before-images). With
``"revert_ranges": true`` the revert step first clears the column range by
range in revert subtasks (DESIGN 13), so framework tests exercise that step
without a built-in job type. Params::

    {"table": "items", "column": "d", "type": "text", "expr": "md5(b)"}

``test-fill-verify`` is the worked example of a job type of several steps
(docs/design.md, "Job-type protocol")::

    fill (ranges) ─► verify (ranges) ─► index (fixed: 1 subtask) ─► cut-over
    write-reorg      write-reorg        write-reorg                 public

``fill`` as above; ``verify`` checks every range holds ``expr`` (a row that
does not fails the job, which is rolled back); ``index`` runs CREATE INDEX
CONCURRENTLY on the column, outside any transaction, its lease renewed by
the pool meanwhile; the cut-over (``advance``) comments the column, under the
owner's bounded lock_timeout. Between steps (``enter_step``) the column's
comment names the step entered, so tests see the DDL ran in the step's
fenced transaction. Rollback from any step clears the ranges ``fill`` made
progress on (with ``revert_ranges``) and drops the index and the column.

In-process tests get both registered by support.fixtures; worker processes
through ``REORG_JOB_TYPES=support.fill:register`` (support.processes).
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from framework import faults, jobtype
from framework.errors import InvalidParams
from framework.jobtype import JobType
from framework.records import Job, Step, Target
from framework.store import jobs, owner_lease, steps
from framework.store.owner_lease import OwnerTerm
from framework.submit import SubmitRequest, submit
from framework.subtask import Batch, SubtaskContext
from support.db import make_items

NAME = "test-fill"
STEPS_NAME = "test-fill-verify"


def fill(expr: str, *, table: str = "items", column: str = "d", type: str = "text",
         revert_ranges: bool = False, steps: bool = False, **knobs: Any) -> SubmitRequest:
    """A submit of ``test-fill`` (``steps``: of ``test-fill-verify``):
    ``column`` (added, of ``type``) := ``expr``."""
    params = {"table": table, "column": column, "type": type, "expr": expr}
    if revert_ranges:
        params["revert_ranges"] = True
    return SubmitRequest(STEPS_NAME if steps else NAME, params, **knobs)


def started_fill(db: Any, n_ranges: int, *, term: OwnerTerm | None = None,
                 table: str = "items", expr: str = "md5(b)",
                 prepared: bool = False) -> tuple[int, OwnerTerm]:
    """A ``test-fill`` job on ``table`` (``make_items`` of ``10 * n_ranges``
    rows) started by hand, as an owner would without its prepare: ranges of
    10 keys at step 1, running. ``term``: the owner's (campaigned for as
    ``owner-a`` when None); ``prepared``: column d added as the prepare would,
    for a test that runs the job's batches. Returns the job and the term."""
    make_items(db, 10 * n_ranges, table=table)
    job_id = submit(db, fill(expr, table=table)).job_id
    with db.begin() as conn:
        if prepared:
            conn.execute(text(f"ALTER TABLE {_quote(table)} ADD COLUMN d text"))
        if term is None:
            term = owner_lease.campaign(db, conn, "owner-a")
            assert term is not None, "another owner holds the lease"
        steps.insert_ranges(db, conn, term, job_id, 1,
                            [(1 + 10 * i, 11 + 10 * i) for i in range(n_ranges)])
        jobs.start(db, conn, term, job_id, actor="t", step=1, row_estimate=10 * n_ranges,
                   run_on_node=None, detail="test")
    return job_id, term


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class FillJob(JobType):
    name = NAME

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        table = conn.execute(text("SELECT to_regclass(:t)::oid"),
                             {"t": params.get("table", "")}).scalar()
        if table is None:
            raise InvalidParams(f"table {params.get('table')!r} does not exist; create it")
        schema, name, key = conn.execute(text("""
            SELECT n.nspname, c.relname, a.attname FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
            WHERE c.oid = :t"""), {"t": table}).one()
        return Target(f"{_quote(schema)}.{_quote(name)}", _quote(key), dict(params))

    def prepare(self, conn: Connection, job: Job) -> None:
        p = job.params
        conn.execute(text("SET LOCAL lock_timeout = '1s'"))
        conn.execute(text(f"ALTER TABLE {job.target_table} "
                          f"ADD COLUMN {_quote(p['column'])} {p['type']}"))

    def write_batch(self, ctx: SubtaskContext, conn: Connection) -> Batch:
        """Fill the batch from ``ctx.curr_key``."""
        job, p = ctx.job, ctx.job.params
        t, k, curr = job.target_table, job.key_column, ctx.curr_key
        last, count = conn.execute(text(
            f"SELECT max(k), count(*) FROM (SELECT {k} AS k FROM {t} WHERE {k} >= :lo "
            f"AND {k} < :end ORDER BY {k} LIMIT :n) batch"),
            {"lo": curr, "end": ctx.end_key, "n": job.batch_rows}).one()
        upper = ctx.end_key if count < job.batch_rows or last is None else last + 1
        conn.execute(text(f"UPDATE {t} SET {_quote(p['column'])} = ({p['expr']}) "
                          f"WHERE {k} >= :lo AND {k} < :hi"), {"lo": curr, "hi": upper})
        return Batch(upper, int(count))

    def advance(self, conn: Connection, job: Job) -> None:
        pass

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        return bool(job.params.get("revert_ranges"))

    def revert_subtask(self, ctx: SubtaskContext) -> None:
        """Clear the column in ctx's range, ``batch_rows`` keys a batch."""
        job = ctx.job
        t, k, col = job.target_table, job.key_column, _quote(job.params["column"])

        def clear(conn: Connection) -> Batch:
            last = conn.execute(text(
                f"SELECT {k} FROM {t} WHERE {k} >= :lo AND {k} < :end ORDER BY {k} "
                "OFFSET :skip LIMIT 1"),
                {"lo": ctx.curr_key, "end": ctx.end_key, "skip": job.batch_rows - 1}).scalar()
            upper = ctx.end_key if last is None else last + 1
            cleared = conn.execute(text(
                f"UPDATE {t} SET {col} = NULL WHERE {k} >= :lo AND {k} < :hi "
                f"AND {col} IS NOT NULL"), {"lo": ctx.curr_key, "hi": upper}).rowcount
            faults.hit("worker.in_restore_batch")
            return Batch(upper, cleared)

        ctx.run_batches(clear)

    def revert(self, conn: Connection, job: Job) -> None:
        conn.execute(text("SET LOCAL lock_timeout = '5s'"))
        conn.execute(text(f"ALTER TABLE IF EXISTS {job.target_table} "
                          f"DROP COLUMN IF EXISTS {_quote(job.params['column'])}"))


FILL, VERIFY, INDEX = 1, 2, 3  # stored step numbers: never renumber


class FillVerifyJob(FillJob):
    """``test-fill-verify``: fill, verify, index, cut-over (module docstring)."""

    name = STEPS_NAME
    steps = (Step("fill", schema_state="write-reorg"),
             Step("verify", restore=False, schema_state="write-reorg"),
             Step("index", ranges=False, restore=False, schema_state="write-reorg"))
    done_schema_state = "public"
    batch_steps = (FILL,)  # quick fill subtasks share a transaction (run_batch)

    def enter_step(self, conn: Connection, job: Job, step: int) -> None:
        conn.execute(text(f"COMMENT ON COLUMN {job.target_table}.{_quote(job.params['column'])} "
                          f"IS 'entered step {step}'"))

    def fixed_subtasks(self, conn: Connection, job: Job, step: int) -> list[dict[str, Any]]:
        return [{"index": index_name(job)}]

    def run_subtask(self, ctx: SubtaskContext) -> None:
        if ctx.job.step == FILL:
            super().run_subtask(ctx)
        elif ctx.job.step == VERIFY:
            ctx.run_batches(lambda conn: self._verify(ctx, conn))
        elif ctx.job.step == INDEX:
            self._build_index(ctx)
        else:
            raise ValueError(f"{STEPS_NAME} has no step {ctx.job.step}")

    @staticmethod
    def _verify(ctx: SubtaskContext, conn: Connection) -> Batch:
        """Check ``batch_rows`` keys a batch; the checkpoint counts them."""
        job, p = ctx.job, ctx.job.params
        t, k, col = job.target_table, job.key_column, _quote(p["column"])
        last, count, wrong = conn.execute(text(
            f"SELECT max(k), count(*), min(k) FILTER (WHERE NOT ok) FROM ("
            f"SELECT {k} AS k, {col} IS NOT DISTINCT FROM ({p['expr']}) AS ok FROM {t} "
            f"WHERE {k} >= :lo AND {k} < :end ORDER BY {k} LIMIT :n) batch"),
            {"lo": ctx.curr_key, "end": ctx.end_key, "n": job.batch_rows}).one()
        if wrong is not None:
            raise ValueError(f"verify: key {wrong} does not hold {p['expr']}")
        upper = ctx.end_key if count < job.batch_rows or last is None else last + 1
        return Batch(upper, int(count))

    @staticmethod
    def _build_index(ctx: SubtaskContext) -> None:
        """CREATE INDEX CONCURRENTLY cannot run in a transaction, so it is not
        exactly-once: a retry drops what an interrupted build left (an
        invalid index) and builds again. The pool renews the lease meanwhile;
        the worker's statement timeout (half a lease) is lifted for it."""
        job = ctx.job
        name = _quote(ctx.meta["index"])
        schema = job.target_table.split(".")[0]
        with ctx.engine.connect() as raw:
            conn = raw.execution_options(isolation_level="AUTOCOMMIT")
            with ctx.cancel_on_stop(conn):
                conn.execute(text("SET statement_timeout = 0"))
                invalid = conn.execute(text(
                    "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = "
                    "to_regclass(:name)"), {"name": f"{schema}.{name}"}).scalar()
                if invalid:
                    conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}"))
                conn.execute(text(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {job.target_table} "
                    f"({_quote(job.params['column'])})"))
                conn.execute(text("RESET statement_timeout"))
        ctx.commit(lambda conn: Batch(ctx.end_key, 0))

    def advance(self, conn: Connection, job: Job) -> None:
        """The cut-over: one short DDL under the owner's bounded lock_timeout."""
        conn.execute(text(f"COMMENT ON COLUMN {job.target_table}.{_quote(job.params['column'])} "
                          "IS 'public'"))

    def revert(self, conn: Connection, job: Job) -> None:
        schema = job.target_table.split(".")[0]
        conn.execute(text("SET LOCAL lock_timeout = '5s'"))
        conn.execute(text(f"DROP INDEX IF EXISTS {schema}.{_quote(index_name(job))}"))
        super().revert(conn, job)


class WarmsOnCue(FillJob):
    """``test-fill`` with an owner-side analysis behind a warm-up (Spark's
    first start on the owner, seconds) that ends when the test sets ``go``;
    ``warming`` is set once the owner has started it."""

    name = "test-warms-on-cue"

    def __init__(self) -> None:
        self.warming, self.go = threading.Event(), threading.Event()

    def warm_up(self, job: Job | None) -> None:
        self.warming.set()
        self.go.wait(60)

    def analyse(self, conn: Connection, job: Job) -> dict[str, Any]:
        return dict(job.params)


def index_name(job: Job) -> str:
    """The index the ``index`` step builds (tests compute it from the job id)."""
    return f"reorg_{job.id}_{job.params['column']}_idx"


def register() -> None:
    jobtype.register(FillJob())
    jobtype.register(FillVerifyJob())
