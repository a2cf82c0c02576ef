"""A job's rows done and rows total: one figure wherever it shows (issue 22,
item 12). ``reorg status`` (text and --json), the dashboard, the owner's
metrics, the success event and ``reorg wait`` read the same two numbers, and
done never shows above total: of a job of several steps, the rows of its
current range step (once it ended, of its last one) against that step's
estimate, which grows to the rows known when it was low."""

from __future__ import annotations

import re
import urllib.request

from cli_support import job_status, ok, reorg
from dashboard_support import running_dashboard
from prometheus_client import REGISTRY
from support import execute, fill, job_of, make_items, wait_state, wait_until

from framework import control, faults
from framework.db import Database
from framework.submit import SubmitRequest, submit

ROWS = 3_000


def _page(base: str, path: str) -> str:
    with urllib.request.urlopen(base + path, timeout=10) as response:
        return response.read().decode()


def _rows_cell(table: str, job_id: int) -> str:
    """The ROWS cell of the job's line in ``reorg status``'s table (left
    aligned under its header)."""
    header, *lines = table.splitlines()
    line = next(li for li in lines if li.split()[:1] == [str(job_id)])
    return line[header.index(" ROWS ") + 1:].split()[0]


def _gauge(name: str, job_id: int) -> float | None:
    return REGISTRY.get_sample_value(name, {"job_id": str(job_id)})


def test_a_finished_alter_type_shows_its_rows_alike_in_status_dashboard_metrics_events_and_wait(
        db: Database, migrated_db: str, start_node) -> None:
    url = migrated_db
    execute(url, "CREATE TABLE o (id serial PRIMARY KEY, b text NOT NULL, n int); "
                 f"INSERT INTO o (b, n) SELECT 'v' || g, g FROM generate_series(1, {ROWS}) g; "
                 "ANALYZE o")
    job = submit(db, SubmitRequest("alter-type", {"table": "o", "column": "n", "type": "bigint"},
                                   rows_per_subtask=1_000, batch_rows=500)).job_id
    start_node("n1", slots=2)  # in this process: its owner sets this process's metrics
    assert wait_state(db, job)["state"] == "succeeded"

    shown = job_status(url, job)
    assert shown["percent"] == 100.0
    table = ok(reorg(url, "status", str(job)))
    waited = reorg(url, "wait", str(job))
    assert waited.returncode == 0, waited.stderr
    done = [e["detail"] for e in control.events(db, job) if e["to_state"] == "succeeded"]
    # The owner reads an ended job once more: its final figures.
    wait_until(lambda: _gauge("reorg_job_progress_ratio", job) == 1.0, 30,
               "the owner's metrics of the ended job")
    with running_dashboard(url) as dash:
        pages = [_page(dash.base, path) for path in ("/", f"/jobs/{job}")]
    seen = {
        "status --json": (shown["rows_done"], shown["rows_total"]),
        "status": _rows_cell(table, job),
        "wait": re.sub(r" in \S+$", "", waited.stdout.strip()),
        "event": re.findall(r"[\d,]+ rows", done[0]),
        "metrics": _gauge("reorg_job_rows_done", job),
        "dashboard": [re.findall(r"[\d,]+ / [\d,]+", page) for page in pages],
    }
    assert seen == {
        "status --json": (ROWS, ROWS),
        "status": "3,000/3,000",
        "wait": f"job {job} succeeded: 3,000 rows",
        "event": ["3,000 rows"],
        "metrics": ROWS,
        "dashboard": [["3,000 / 3,000"], ["3,000 / 3,000"]],
    }

def test_rows_done_past_a_low_estimate_grow_the_total_instead_of_passing_it(
        db: Database, migrated_db: str, start_node) -> None:
    """The split counted 1,000 rows; the application filled the gaps of the
    key space after it, so the ranges hold 2,000: a running job shows its
    rows done against a total grown to them, never more done than total."""
    url = migrated_db
    make_items(url, 2_000)
    execute(url, "DELETE FROM items WHERE id % 2 = 0; ANALYZE items")
    job = submit(db, fill("md5(b)", steps=True, rows_per_subtask=2_000, batch_rows=100)).job_id
    start_node("owner", slots=0)  # prepares and splits; nothing runs the ranges yet
    wait_state(db, job, {"running"})
    assert job_of(db, job)["rows_total"] == 1_000
    execute(url, "INSERT INTO items SELECT g, g % 97, 'v' || g FROM generate_series(2, 2000, 2) g")
    faults.arm("worker.after_batch", "block@15")  # 1,500 rows of the fill step done
    start_node("worker", slots=1)
    faults.wait_blocked("worker.after_batch", 60)

    shown = job_status(url, job)
    assert shown["state"] == "running" and shown["step_name"] == "fill"
    assert shown["rows_done"] == 1_500
    assert shown["rows_done"] <= shown["rows_total"], shown
    assert shown["step_percent"] < 100.0 and shown["percent"] < 100.0
    table = ok(reorg(url, "status", str(job)))
    assert _rows_cell(table, job) == f"1,500/{shown['rows_total']:,}", table
    faults.release("worker.after_batch")
    final = wait_state(db, job)
    assert (final["state"], final["rows_done"], final["rows_total"]) == ("succeeded", 2_000, 2_000)
