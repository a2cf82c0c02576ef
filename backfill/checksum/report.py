"""A ``checksum`` job's findings, summed up from its subtasks' meta (live and
history, as ``framework.store.history.subtasks_of_job`` reads them): what
``reorg checksum-report`` prints."""

from __future__ import annotations

from typing import Any

from framework.errors import InvalidParams
from framework.records import Job

# What a subtask's batches record in its meta (``batches.Findings``), under
# META_KEY: a count per kind of mismatch, ranges and keys. Defined here, with
# the reader, so that ``reorg checksum-report`` imports neither Spark's nor
# the batch loop's modules.
KINDS = ("missing_in_target", "missing_in_source", "different")
META_KEY = "checksum"


def report(job: Job, subtasks: list[dict[str, Any]], max_keys: int = 1000) -> dict[str, Any]:
    """A checksum job's findings so far, from its subtasks (live and history,
    read with the job in one snapshot).

    ``state`` is the job's;
    ``complete`` is True once every subtask has succeeded; ``mismatches`` counts
    every mismatching key, ``by_kind`` splits it into ``missing_in_target``
    (in --table, not in --target), ``missing_in_source`` (the reverse) and
    ``different``; ``ranges`` lists the mismatching key ranges (``None``:
    unbounded) and ``keys`` up to ``max_keys`` of the recorded keys (at most
    1000 per subtask are recorded), in key order.

    Key order is the database's, never Python's: the subtasks tile the key
    space in ordinal order, a subtask's batches run in key order, and a
    batch's comparison returns its keys sorted by PostgreSQL (on a text key,
    by its collation, where Python's order of the stored JSON would put
    ``'B'`` before ``'a'``). So the findings are concatenated in that order,
    not sorted here."""
    if job.type != "checksum":
        raise InvalidParams(f"job {job.id} is a {job.type} job, not a checksum job; only "
                            "`reorg submit checksum` jobs have findings to report")
    by_kind = dict.fromkeys(KINDS, 0)
    ranges: list[dict[str, Any]] = []
    keys: list[dict[str, Any]] = []
    dropped = 0
    for row in sorted(subtasks, key=lambda r: (r["step"], r["ordinal"])):
        found = (row["meta"] or {}).get(META_KEY) or {}
        for kind in KINDS:
            by_kind[kind] += int(found.get(kind, 0))
        ranges += [{"start_key": lo, "end_key": hi, "mismatches": n}
                   for lo, hi, n in found.get("ranges", [])]
        keys += [{"key": k, "kind": kind} for k, kind in found.get("keys", [])]
        dropped += int(found.get("ranges_dropped", 0))
    mismatches = sum(by_kind.values())
    return {
        "job_id": job.id,
        "table": job.target_table.replace('"', ""),
        "target": job.params.get("target"),
        "columns": [c["name"] for c in job.params.get("columns", [])],
        "state": job.state,
        "complete": bool(subtasks) and all(r["state"] == "succeeded" for r in subtasks),
        "subtasks": len(subtasks),
        "rows_compared": sum(int(r["row_count"] or 0) for r in subtasks),
        "mismatches": mismatches,
        "by_kind": by_kind,
        "ranges": ranges,
        "ranges_not_listed": dropped,
        "keys": keys[:max_keys],
        "keys_not_listed": mismatches - min(len(keys), max_keys),
    }
