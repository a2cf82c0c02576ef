"""``reorg history``: finished subtasks, read from ``background_subtask_history``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.context import cli_state
from cli.output import count, print_rows
from framework.errors import InvalidParams
from framework.keys import decode, shown
from framework.store import history as history_store
from framework.store import jobs

if TYPE_CHECKING:
    from framework.directdb import DirectDatabase

app = typer.Typer()


def finished_subtasks(db: DirectDatabase, job_id: int | None, limit: int) -> list[dict[str, Any]]:
    with db.begin() as conn:
        if job_id is not None and jobs.state(db, conn, job_id) is None:
            raise InvalidParams(f"job {job_id} does not exist; `reorg status` lists jobs")
        return history_store.list_finished(db, conn, job_id, limit)


@app.command()
def history(
    ctx: typer.Context,
    job_id: Annotated[int | None, typer.Option("--job", metavar="JOB",
                                               help="Only this job's subtasks.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="Show at most N subtasks.")] = 100,
) -> None:
    """Finished subtasks: their range, rows, attempts and error."""
    rows = finished_subtasks(cli_state(ctx).direct_database(), job_id, limit)
    print_rows(rows, as_json=as_json, empty="no finished subtasks yet", columns={
        "ID": True, "JOB": True, "ORDINAL": True, "STATE": False, "RANGE": False, "ROWS": True,
        "ATTEMPTS": True, "ERROR": False,
    }, cells=lambda r: (str(r["id"]), str(r["job_id"]), str(r["ordinal"]), r["state"],
                        f"[{_key(r['start_key'])}, {_key(r['end_key'])})", count(r["row_count"]),
                        str(r["attempts"]), r["error"] or ""))


def _key(stored: Any) -> str:
    return shown(decode(stored))
