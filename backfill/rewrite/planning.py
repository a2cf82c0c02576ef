"""The planner's side of ``rewrite``: the request checked at submit (a plan
made with job id 0, what the swap could not carry, what --keep-old could
not invert), planned again for real by prepare, and every state's
statements for ``--dry-run``."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import Connection

from backfill.rewrite import names, reverse, shadow, spark_rows, stored, uncarried
from backfill.rewrite.capture import Capture
from backfill.rewrite.shadow import Plan, Request
from backfill.rewrite.swap import Swap, cleanup_statements, rollback_statements
from backfill.tables import parse_assignment
from framework import privileges
from framework.errors import InvalidParams
from framework.keys import quote
from framework.privileges import run_as
from framework.records import Job

# --verify: "full" compares every range of T with the shadow before the
# swap; "off" compares nothing (as pg_repack): the change log alone.
VERIFY_CHOICES = ("full", "off")
_DURATION = re.compile(r"^\s*(\d+)\s*(s|sec|m|min|h|d)?\s*$")
_UNIT_SECONDS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def keep_old_seconds(value: Any) -> int:
    """``--keep-old``: 0, a number of seconds, or 90s, 30m, 2h, 1d."""
    if isinstance(value, int) and value >= 0:
        return value
    found = _DURATION.match(str(value if value is not None else "0"))
    if not found:
        raise InvalidParams(f"--keep-old {value!r} is not a duration; write e.g. 30m, 2h or "
                            "1d (0: drop the old table at once)")
    return int(found.group(1)) * _UNIT_SECONDS[found.group(2)]


def request_of(params: dict[str, Any]) -> Request:
    """The four forms, from the job's (normalised) params. With --engine
    spark, the --set is Spark's: its column is left out of the SQL copy."""
    sets = tuple((c, e) for c, e in params.get("sets") or ())
    on_spark = params.get("engine", "sql") == "spark"
    return Request(order_by=tuple(params.get("order_by") or ()), alter=params.get("alter"),
                   like=params.get("like"), sets=() if on_spark else sets,
                   computed=tuple(c for c, _ in sets) if on_spark else ())


def normalised(params: dict[str, Any]) -> dict[str, Any]:
    """The params as the job keeps them (``--set`` parsed, --keep-old in seconds)."""
    order_by = params.get("order_by") or []
    if isinstance(order_by, str):
        order_by = [c.strip() for c in order_by.split(",") if c.strip()]
    sets = [list(parse_assignment(s)) if isinstance(s, str) else list(s)
            for s in params.get("sets") or []]
    if len({c for c, _ in sets}) != len(sets):
        raise InvalidParams("--set names a column twice; give each column one --set")
    verify = params.get("verify") or "full"
    if verify not in VERIFY_CHOICES:
        raise InvalidParams(f"--verify {verify!r}: give one of {', '.join(VERIFY_CHOICES)} "
                            "(full: every range compared before the swap)")
    engine = params.get("engine") or "sql"
    if engine not in spark_rows.ENGINES:
        raise InvalidParams(f"--engine {engine!r}: give sql (the --set is SQL, computed by "
                            "PostgreSQL) or spark (one --set, a Spark SQL expression)")
    udf = (params.get("udf") or "").strip() or None
    if engine == "spark" and len(sets) != 1:
        raise InvalidParams("--engine spark computes one column on Spark: give exactly one "
                            "--set COLUMN=EXPR (a Spark SQL expression of the row)")
    if udf and engine != "spark":
        raise InvalidParams("--udf is for --engine spark: add --engine spark, or leave out "
                            "--udf and give the --set as SQL")
    if udf:
        spark_rows.check_udf(udf)
    alter = params.get("alter")
    if alter is not None and not alter.strip():
        raise InvalidParams("--alter is empty; give the actions of one ALTER TABLE, or leave "
                            "it out for a repack")
    return {"table": params.get("table") or "", "order_by": order_by, "alter": alter,
            "like": params.get("like"), "sets": sets,
            "keep_old_seconds": keep_old_seconds(params.get("keep_old_seconds",
                                                            params.get("keep_old", 0))),
            "kill_blockers": bool(params.get("kill_blockers")), "verify": verify,
            "engine": engine, "udf": udf}


def checked_plan(conn: Connection, table: str, job_id: int, params: dict[str, Any]) -> Plan:
    """The plan of the request, with everything refused that the job could
    not finish: one line, naming the object (InvalidParams)."""
    if not table:
        raise InvalidParams("no table given; pass --table SCHEMA.TABLE")
    plan = shadow.plan(conn, table, job_id, request_of(params))
    refused = uncarried.of_plan(conn, plan)
    if refused:
        raise InvalidParams(refused[0])
    shape = dict(plan.shape)
    for column in plan.order_by:
        # The verify step reads the shadow's rows by the copy's ranges.
        if column not in shape:
            raise InvalidParams(f"--order-by {column}: the new shape has no column {column}; "
                                "order by columns the new table keeps")
        if shape[column] != dict(plan.source).get(column):
            raise InvalidParams(f"--order-by {column}: the new shape changes its type; order "
                                "by columns whose type stays")
    if params.get("keep_old_seconds"):
        refused = reverse.refusals(plan, *_computed(plan, params))
        if refused:
            raise InvalidParams(refused[0])
    return plan


def _computed(plan: Plan, params: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The columns --set computes, and those an --alter's USING computes."""
    sets = {c for c, _ in params.get("sets") or ()}
    source = dict(plan.source)
    using = {c.name for c in plan.columns
             if c.name in source and c.name not in sets and c.value != quote(c.name)}
    return sets, using


def check_submitter(conn: Connection, plan: Plan) -> None:
    """The copy reads T as the submitter (it carries their --set): they must
    be able to read it; and a rewrite replaces T, which only its owner may."""
    display = f"{plan.schema}.{plan.table_name}"
    privileges.check_table_privileges(conn, plan.table, display, ("SELECT",))
    privileges.check_owns_table(conn, plan.table, display, "a rewrite")


def swap_of(job: Job, plan: Plan) -> Swap:
    return Swap(plan, job.params["work_schema"], run_as(job),
                spark_rows.spark_set_of(job.params, plan))


def capture_of(job: Job, plan: Plan) -> Capture:
    return swap_of(job, plan).capture


# The submitter's privileges on the shadow: the copy and the replays write
# it as them (``framework.privileges``); the swap's carry replaces them by T's.
SHADOW_GRANT = "SELECT, INSERT, DELETE"


def prepare_statements(job: Job, plan: Plan) -> list[str]:
    """The shadow in the new shape, the log and the capture trigger (then
    the submitter's grant on the shadow, and the plan kept): one
    transaction, so no write of T falls between."""
    s = swap_of(job, plan)
    # An --order-by copy leaves out the keys in the log (``work.copy_statement``):
    # looked up by key, batch after batch.
    keyed = ([f"CREATE INDEX ON {s.capture.log} ({', '.join(s.capture.log_key.names())})"]
             if plan.order_by else [])
    return [*plan.create, *s.capture.install(), *keyed]


def describe(conn: Connection, job: Job, plan: Plan) -> list[str]:
    """Every state's statements, as the job would run them (job id 0)."""
    s = swap_of(job, plan)
    keep = job.params.get("keep_old_seconds") or 0
    lines = ["prepare (write-only: one transaction):"]
    lines += [f"  {st}" for st in prepare_statements(job, plan)]
    role = run_as(job)
    if role:
        lines.append(f"  GRANT {SHADOW_GRANT} ON {plan.shadow} TO {privileges.quote_role(role)} "
                     "(unless the submitter is the workers' role)")
    lines += [f"  {st}" for st in stored.save_statements(job.params["work_schema"], plan)[:1]]
    lines.append("copy (write-reorg, by range, as the submitter; T's triggers do not fire):")
    k = plan.copy_key.expr()
    ordered = f" ORDER BY {plan.copy_key.order_by()}" if plan.order_by else ""
    lines.append("  " + _one_line(_insert(s, f"{k} >= lo AND {k} < hi", ordered)))
    lines.append("build (write-reorg, one subtask each):")
    for build in plan.builds:
        lines += [f"  {_one_line(st)}" for st in (*build.statements,
                                                   *filter(None, [build.validate]))]
    lines += [f"  note: {note}" for note in plan.notes]
    lines.append("catch-up (write-reorg): log rows taken oldest first, each key's shadow row "
                 "deleted and T's current row copied again, until less than a batch is left:")
    lines.append(f"  DELETE FROM {s.capture.log} ... RETURNING key; DELETE FROM {plan.shadow} "
                 "WHERE key IN (...); " + _one_line(_insert(s, "key IN (...)")))
    analyze = f"; one subtask first takes the statistics: ANALYZE {plan.shadow}"
    if job.params.get("verify", "full") == "off":
        lines.append("verify (write-reorg, by range): off (--verify off): nothing compared; "
                     "each range replays a batch of the log" + analyze)
    else:
        lines.append("verify (write-reorg, by range): a checksum of the range's rows in T and "
                     "in the shadow (keys in the log left to the replay); a range that differs "
                     "is copied again, then must match" + analyze)
    lines.append("swap (public: one transaction, lock_timeout 2s, retried with backoff"
                 + (", blockers terminated" if job.params.get("kill_blockers") else "") + "):")
    lines.append(f"  LOCK TABLE {plan.shadow}, {plan.table} IN ACCESS EXCLUSIVE MODE; the "
                 "last log rows replayed; capture triggers dropped; T's indexes renamed away")
    lines.append(f"  ALTER TABLE {plan.table} RENAME TO "
                 f"{quote(names.old_table(plan.job_id, plan.table_name))}")
    lines.append(f"  ALTER TABLE {plan.shadow} RENAME TO {quote(plan.table_name)}")
    lines += [f"  {_one_line(st)}" for st in _carry_statements(conn, plan, s)]
    if keep:
        lines.append(f"  a reverse capture on the new {plan.table} keeps the old table in step "
                     f"for {keep} s (`reorg revert JOB` swaps back)")
    lines.append("swapped (public): foreign keys of other tables validated"
                 + (f"; the old table kept {keep} s" if keep else ""))
    lines.append("cleanup (at the end of swapped):")
    lines += [f"  {st}" for st in cleanup_statements(s)]
    lines.append("rollback before the swap (cancel, failure; T never written):")
    lines += [f"  {st}" for st in rollback_statements(s)]
    return lines


def _carry_statements(conn: Connection, plan: Plan, s: Swap) -> list[str]:
    """What the swap would carry over, read with the shadow made for the
    occasion (in a savepoint rolled back: ``describe`` changes nothing)."""
    from backfill.rewrite import carry  # the swap's module: only for a dry run
    from backfill.schema.sql import run

    with conn.begin_nested() as trial:
        for statement in plan.create:
            run(conn, statement)
        carried = carry.read(conn, plan.table, plan.shadow, source_after=s.old,
                             target_after=plan.table,
                             target_names={b.final for b in plan.builds})
        trial.rollback()
    return [*carried.statements, *(f"CREATE OR REPLACE VIEW {v.name} ..." for v in carried.views),
            *(f"after the commit: {st}" for st in carried.after_commit)]


def _insert(s: Swap, where: str, order_by: str = "") -> str:
    """The statement writing T's rows ``where`` into the shadow, as the job
    runs it: with --engine spark, after Spark computed its column."""
    plan = s.plan
    if s.spark is None:
        return plan.insert_into(plan.shadow, plan.select(where) + order_by)
    read = (f"Spark reads SELECT *, xmin FROM {plan.table} WHERE {where} and computes "
            f"{s.spark.column} = {s.spark.expr}"
            + (f" (--udf {s.spark.udf})" if s.spark.udf else "") + "; COPY into stage; ")
    return read + spark_rows.insert_statement(plan, s.spark, "stage", where, order_by)


def _one_line(statement: str) -> str:
    return " ".join(statement.split())
