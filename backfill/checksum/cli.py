"""``reorg checksum-report JOB``: what a ``reorg submit checksum`` job found,
and its line under ``reorg status JOB``. Joined to the ``reorg`` command
through the ``reorg.commands`` and ``reorg.status_lines`` entry points
(``cli.plugin``): cli/ names no job type.

The exit code is the verdict, so scripts can gate on it:

    0  the comparison is complete and the tables match
    3  the comparison is complete and the tables differ
    4  no verdict: the comparison is not complete (the job is still queued or
       running, or stopped before the end); what it found so far is shown
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.plugin import count, print_json, read_database, table_name
from framework.db import Database
from framework.errors import InvalidParams
from framework.keys import decode, shown
from framework.states import JobState
from framework.store import history, jobs

if TYPE_CHECKING:
    from framework.directdb import DirectDatabase

app = typer.Typer()

MISMATCH_EXIT = 3
INCOMPLETE_EXIT = 4
HUMAN_KEYS = 20  # keys listed by default; --json lists every recorded one
JSON_KEYS = 1000
SHOWN_RANGES = 20
_STOPPED = {JobState.CANCELLING, JobState.FAILED, JobState.REVERTING, JobState.CANCELLED,
            JobState.REVERTED}
_KIND_MEANING = {
    "missing_in_target": "in {table}, not in {target}",
    "missing_in_source": "in {target}, not in {table}",
    "different": "in both, with different values",
}


def load_report(db: Database | DirectDatabase, job_id: int, max_keys: int) -> dict[str, Any]:
    """``backfill.checksum.report.report`` of a job: the job and all its subtasks
    read in one snapshot."""
    from backfill.checksum.report import report

    with db.begin(isolation_level="REPEATABLE READ") as conn:
        job = jobs.get(db, conn, job_id)
        if job is None:
            raise InvalidParams(f"job {job_id} does not exist; `reorg status` lists jobs")
        return report(job, history.subtasks_of_job(db, conn, job_id), max_keys)


def exit_code(found: dict[str, Any]) -> int:
    if not found["complete"]:
        return INCOMPLETE_EXIT
    return MISMATCH_EXIT if found["mismatches"] else 0


@app.command("checksum-report")
def checksum_report(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(
        metavar="JOB", help="Job id of a checksum job, as printed by `reorg submit checksum`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")] = False,
    max_keys: Annotated[int | None, typer.Option(
        min=0, show_default=False,
        help=f"List at most N mismatching keys, in key order (default {HUMAN_KEYS}, with "
             f"--json {JSON_KEYS}; up to 1,000 per subtask are recorded).")] = None,
) -> int:
    """What a checksum job found: mismatches by kind, key ranges, first keys.

    Also whether the comparison is complete and how many rows it compared.
    Exit code: 0 complete and the tables match; 3 complete and they differ;
    4 not complete yet (findings so far are shown).
    """
    limit = max_keys if max_keys is not None else (JSON_KEYS if as_json else HUMAN_KEYS)
    found = load_report(read_database(ctx), job_id, limit)
    if as_json:
        print_json(found)
    else:
        for line in describe(found):
            print(line)
    return exit_code(found)


def describe(found: dict[str, Any]) -> list[str]:
    """The report as lines for people, ending with the verdict."""
    table, target = table_name(found["table"]), found["target"] or "?"
    job_id, state = found["job_id"], found["state"]
    lines = [f"checksum job {job_id}: {table} against {target} "
             f"(columns {', '.join(found['columns']) or '-'})"]
    done = "comparison complete" if found["complete"] else "comparison not complete"
    lines.append(f"  {'state':<19}{state}, {done}")
    lines.append(f"  {'rows compared':<19}{count(found['rows_compared'])} in "
                 f"{_plural(found['subtasks'], 'subtask')}")
    lines.append(f"  {'mismatches':<19}{count(found['mismatches'])}")
    width = max(len(count(n)) for n in found["by_kind"].values())
    for kind, n in found["by_kind"].items():
        meaning = _KIND_MEANING.get(kind, "").format(table=table, target=target)
        lines.append(f"    {kind:<19}{count(n):>{width}}  ({meaning})")
    ranges = found["ranges"]
    if ranges:
        lines.append(f"  mismatching key ranges: {count(len(ranges))}"
                     + (f", first {SHOWN_RANGES} (--json lists all)" if len(ranges) > SHOWN_RANGES
                        else ""))
        for r in ranges[:SHOWN_RANGES]:
            lines.append(f"    {_range(r['start_key'], r['end_key']):<28}{count(r['mismatches'])}")
    if found["ranges_not_listed"]:
        lines.append(f"    ({count(found['ranges_not_listed'])} more ranges were not recorded)")
    keys = found["keys"]
    if keys:
        shown = (count(len(keys)) if len(keys) == found["mismatches"]
                 else f"first {count(len(keys))} of {count(found['mismatches'])}")
        lines.append(f"  mismatching keys: {shown}")
        key_width = max(len(_key(k["key"])) for k in keys)
        for k in keys:
            lines.append(f"    {_key(k['key']):>{key_width}}  {k['kind']}")
    if found["keys_not_listed"] and keys:
        lines.append(f"    ... {count(found['keys_not_listed'])} more (a larger --max-keys "
                     "lists more; up to 1,000 per subtask are recorded)")
    lines.append(_verdict(found))
    return lines


def _verdict(found: dict[str, Any]) -> str:
    job_id, state = found["job_id"], found["state"]
    if found["complete"]:
        if found["mismatches"]:
            return f"tables differ: {count(found['mismatches'])} mismatching keys"
        return f"tables match: {count(found['rows_compared'])} rows compared, no mismatches"
    if state == JobState.SUCCEEDED:  # its subtasks' history is past retention
        return (f"no verdict: the findings of job {job_id} are no longer recorded; "
                "submit the checksum again")
    if state in _STOPPED:
        return (f"no verdict: job {job_id} is {state}, it stopped before the comparison "
                "completed; submit the checksum again")
    if state in (JobState.PAUSING, JobState.PAUSED):
        return f"no verdict yet: job {job_id} is {state}; `reorg resume {job_id}` continues it"
    return (f"no verdict yet: job {job_id} is {state}; run `reorg wait {job_id}`, "
            "then this again")


def _plural(n: int, word: str) -> str:
    return f"{count(n)} {word}{'' if n == 1 else 's'}"


def _key(value: Any) -> str:
    """A recorded key for people: ``42``, or a key of any type (its stored
    JSON array) as ``'a1'`` or ``('eu', 3)``."""
    return shown(decode(value)) if isinstance(value, list) else str(value)


def _range(start: Any, end: Any) -> str:
    lo = "(-inf" if start is None else f"[{_key(start)}"
    hi = "+inf)" if end is None else f"{_key(end)})"
    return f"{lo}, {hi}"


def status_line(db: Database, job: dict[str, Any]) -> str | None:
    """One line for ``reorg status JOB`` of a checksum job: its mismatches."""
    found = load_report(db, job["id"], 0)
    so_far = "" if found["complete"] else " so far"
    kinds = ", ".join(f"{count(n)} {k}" for k, n in found["by_kind"].items() if n)
    return (f"checksum: {count(found['mismatches'])} mismatches{so_far}"
            + (f" ({kinds}); `reorg checksum-report {job['id']}` lists them" if kinds else ""))
