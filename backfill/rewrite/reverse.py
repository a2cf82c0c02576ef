"""The reverse capture of ``--keep-old``: after the swap, an AFTER ROW
trigger on the new T writes each change into the old table, through the
inverse of the copy's column mapping, in the application's own
transaction; so the old table stays exact and ``revert`` can swap back
with every write made since.

Only an exact inverse is taken (``refusals``, at submit): each column of
the old table must come back from the new table's column of the same name,
of the same type or of a wider one (integer → bigint, varchar(n) → text,
numeric(p,s) → a numeric holding it, ...). Refused: a dropped column, a
``--set`` or a ``USING`` of an existing column, a narrowing or other type
change. A value the old table cannot take all the same (a bigint past the
integer range, written after the swap) does not fail the application's
write: the trigger records it in a one-row table instead, the old table
is out of step from then on, and ``revert`` refuses, naming that key."""

from __future__ import annotations

import re

from backfill.rewrite import names, triggers
from backfill.rewrite.shadow import Plan
from framework.keys import quote

_INTEGERS = ["smallint", "integer", "bigint"]


def refusals(plan: Plan, request_sets: set[str], using: set[str]) -> list[str]:
    """Why the old table could not be kept exact, one line per column."""
    found = []
    shape = dict(plan.shape)
    for column, old_type in plan.source:
        where = f"--keep-old: column {column}"
        if column not in shape:
            found.append(f"{where} is not in the new shape; a write after the swap could not "
                         "be put back into the old table; drop --keep-old")
        elif column in request_sets or column in using:
            how = "--set" if column in request_sets else "USING"
            found.append(f"{where} gets a computed value ({how}); the old value cannot be "
                         "computed back; drop --keep-old")
        elif not widens(old_type, shape[column]):
            found.append(f"{where} changes type {old_type} -> {shape[column]}, which does not "
                         "hold every old value exactly (or cannot be put back); drop --keep-old")
    return found


def widens(old: str, new: str) -> bool:
    """Whether every value of type ``old`` is the same value in type ``new``."""
    if old == new:
        return True
    if old in _INTEGERS and (new == "numeric" or new in _INTEGERS[_INTEGERS.index(old):]):
        return True
    if (old, new) == ("real", "double precision"):
        return True
    if new == "text" and (old == "character varying" or old.startswith("character varying(")):
        return True
    if old.startswith("character varying(") and new == "character varying":
        return True
    bounded = _typmods(old, new, "character varying")
    if bounded:
        return bounded[1][0] >= bounded[0][0]
    numeric = _typmods(old, new, "numeric")
    if numeric:
        (p, s), (p2, s2) = numeric
        return s2 >= s and p2 - s2 >= p - s
    if old.startswith("numeric(") and new == "numeric":
        return True
    for kind in ("timestamp", "time"):
        for zone in (" without time zone", " with time zone"):
            if old.startswith(kind + "(") and old.endswith(zone) and new in (kind + zone,):
                return True
            precisions = _typmods(old.removesuffix(zone), new.removesuffix(zone), kind)
            if precisions and old.endswith(zone) and new.endswith(zone):
                return precisions[1][0] >= precisions[0][0]
    return False


def _typmods(old: str, new: str, base: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    pattern = re.compile(re.escape(base) + r"\((\d+)(?:,(\d+))?\)$")
    a, b = pattern.match(old), pattern.match(new)
    if not a or not b:
        return None
    return (tuple(int(x or 0) for x in a.groups()), tuple(int(x or 0) for x in b.groups()))


def install(plan: Plan, work_schema: str, old: str, overriding: bool) -> list[str]:
    """The reverse trigger on the new T (named T) writing into ``old``."""
    job, t = plan.job_id, plan.table
    function = names.reverse_function(work_schema, job)
    truncate = names.reverse_truncate_function(work_schema, job)
    broken = names.reverse_broken_table(work_schema, job)
    key = plan.key
    match = " AND ".join(f"{quote(c)} = OLD.{quote(c)}" for c in key.columns)
    columns = [c for c, _ in plan.source]
    values = ", ".join(f"NEW.{quote(c)}" for c in columns)
    listed = ", ".join(quote(c) for c in columns)
    over = " OVERRIDING SYSTEM VALUE" if overriding else ""
    body = f"""  IF EXISTS (SELECT 1 FROM {broken}) THEN
    RETURN NULL;  -- out of step already: revert refuses
  END IF;
  BEGIN
    IF TG_OP <> 'INSERT' THEN
      DELETE FROM {old} WHERE {match};
    END IF;
    IF TG_OP <> 'DELETE' THEN
      INSERT INTO {old} ({listed}){over} VALUES ({values});
    END IF;
  EXCEPTION WHEN others THEN
    INSERT INTO {broken} (key, error)
    VALUES (CAST(CASE WHEN TG_OP = 'DELETE' THEN {key.as_stored('OLD')}
                 ELSE {key.as_stored('NEW')} END AS text), SQLERRM)
    ON CONFLICT DO NOTHING;
  END;
  RETURN NULL;"""
    return [
        f"CREATE TABLE {broken} (one boolean PRIMARY KEY DEFAULT true CHECK (one), "
        "key text NOT NULL, error text NOT NULL, at timestamptz NOT NULL DEFAULT now())",
        *triggers.on_rows(t, names.reverse_trigger(job), function, body),
        *triggers.on_truncate(t, names.reverse_truncate_trigger(job), truncate, old),
    ]


def remove(plan: Plan, work_schema: str, table: str) -> list[str]:
    job = plan.job_id
    return triggers.remove(
        table, (names.reverse_trigger(job), names.reverse_truncate_trigger(job)),
        (names.reverse_function(work_schema, job),
         names.reverse_truncate_function(work_schema, job)))
