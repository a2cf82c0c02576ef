"""What the ``reorg`` commands that read jobs or request a change of one
import, run to their end against a real database (issue 25: ``reorg status
JOB`` ≤ 250 ms as a command; nothing a command does not use is imported).
Each runs in a fresh interpreter, as ``reorg`` would, and prints the modules
it ended with: none of the worker's (node, APScheduler, Spark), the
migrations' (alembic), SQLAlchemy (they go through psycopg alone,
``framework.directdb``), rich (tables are plain columns) or the submit
path's (pglast). ``python -m bench.command_latency`` measures what the rest
costs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_support import ok, reorg
from support.processes import clean_env

ITEMS_ROWS = 100

NEVER = ("pyspark", "framework.node", "apscheduler", "alembic", "sqlalchemy", "rich", "pglast",
         "prometheus_client", "starlette")

# Runs ``reorg ARGS`` in this interpreter as the entry point does, then
# prints (last line) the modules of NEVER that got imported.
_RUN = """
import json, sys
from cli.main import run
code = run(sys.argv[2:])
never = json.loads(sys.argv[1])
print(json.dumps({"code": code, "loaded": sorted(
    m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in never))}))
"""


def _imports(url: str, *args: str) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(NEVER), "--db", url, *args],
                          capture_output=True, text=True, env=clean_env(), timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.stdout, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    return found["code"], found["loaded"]


@pytest.fixture
def jobs(items_db: str) -> dict[str, int]:
    """A queued sql-update job (the fixture's, on ``other``) and a queued
    checksum job: no worker runs them, the commands only read them."""
    listed = json.loads(ok(reorg(items_db, "status", "--json")))
    checksum = json.loads(ok(reorg(items_db, "submit", "checksum", "--table", "items",
                                   "--target", "other", "--json")))["id"]
    return {"job": listed[0]["id"], "checksum": checksum}


def test_read_and_request_commands_import_neither_the_worker_nor_sqlalchemy_nor_rich(
        items_db, jobs):
    job, checksum = str(jobs["job"]), str(jobs["checksum"])
    commands = {
        ("status",): 0, ("status", job): 0, ("status", job, "--json"): 0,
        ("wait", job, "--timeout", "0"): 3,  # queued: the wait times out at once
        ("events", job): 0, ("nodes",): 0, ("history", "--job", job): 0,
        ("checksum-report", checksum): 4,  # no verdict yet: the job is queued
        ("--version",): 0, ("db", "current"): 0,
        # The requests on a job: refused (2) for a queued job, or made (0).
        ("pause", job): 2, ("resume", job): 2, ("retry", job): 2,
        ("alter", job, "--batch-rows", "500"): 0, ("cancel", job): 0,
    }
    for args, code in commands.items():
        assert _imports(items_db, *args) == (code, []), args
    job_now = json.loads(ok(reorg(items_db, "status", job, "--json")))[0]
    assert (job_now["state"], job_now["batch_rows"]) == ("cancelling", 500)


def test_the_check_sees_a_command_that_does_import_them(items_db, jobs):
    """A submit builds SQLAlchemy's engine (its job type's checks run
    through it): the check would catch a command above that did."""
    code, loaded = _imports(items_db, "submit", "checksum", "--table", "items",
                            "--target", "other", "--dry-run")
    assert code == 0 and "sqlalchemy" in loaded
