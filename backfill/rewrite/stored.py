"""A rewrite job's plan (``shadow.Plan``), kept from prepare to cleanup in a
one-row table of reorg's work schema (``names.plan_table``).

Why not the job's params: the plan names what the job creates after the
job's id (``names``), which ``reorg submit`` does not know yet. Submit
plans with id 0 to check the request; the owner's prepare plans again with
the real id, in the transaction that creates the shadow, and keeps that
plan here, so every worker, the swap and an heir after a crash run exactly
the statements prepare checked, whatever T became since."""

from __future__ import annotations

import json

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite import names
from backfill.rewrite.shadow import Plan


def save_statements(work_schema: str, plan: Plan) -> list[str]:
    table = names.plan_table(work_schema, plan.job_id)
    return [f"CREATE TABLE {table} (plan jsonb NOT NULL)",
            f"INSERT INTO {table} VALUES (CAST(:plan AS jsonb))"]


def save(conn: Connection, work_schema: str, plan: Plan) -> None:
    create, insert = save_statements(work_schema, plan)
    conn.execute(text(create))
    conn.execute(text(insert), {"plan": json.dumps(plan.to_params())})


def load(conn: Connection, work_schema: str, job_id: int) -> Plan | None:
    """The job's plan; None before its prepare committed or after its cleanup."""
    table = names.plan_table(work_schema, job_id)
    if not conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": table}).scalar():
        return None
    stored = conn.execute(text(f"SELECT plan FROM {table}")).scalar_one()
    return Plan.from_params(stored)


# Set in the plan's row by the transaction that ANALYZEd the shadow (the
# verify step's, ``work.analyze_once``): the statistics are taken once.
ANALYZED = "analyzed"


def analyzed(conn: Connection, work_schema: str, job_id: int) -> bool:
    """Whether the shadow's statistics were taken (committed)."""
    table = names.plan_table(work_schema, job_id)
    return bool(conn.execute(text(f"SELECT coalesce(CAST(plan ->> '{ANALYZED}' AS boolean), "
                                  f"false) FROM {table}")).scalar_one())


def mark_analyzed(work_schema: str, job_id: int) -> str:
    return (f"UPDATE {names.plan_table(work_schema, job_id)} "
            f"SET plan = plan || jsonb_build_object('{ANALYZED}', true)")


def drop(work_schema: str, job_id: int) -> str:
    return f"DROP TABLE IF EXISTS {names.plan_table(work_schema, job_id)}"
