"""A job type installed from another package, through the ``reorg.job_types``
entry point alone: ``reorg submit --help`` lists it with its own options and
``reorg submit`` runs a job of it on a real worker. The package is a
directory on PYTHONPATH holding the module and a ``*.dist-info`` (METADATA and
entry_points.txt): all importlib.metadata needs to see an installed
distribution."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from cli_support import assert_one_error_line, dump, ok
from support import scalar, wait_until
from support.processes import REORG, TESTS, clean_env

from framework.config import Settings
from framework.db import Database

ITEMS_ROWS = 500

STAMP = '''
"""`stamp`: sets items.c to a value, range by range (a third-party job type)."""

from typing import Annotated

import typer
from sqlalchemy import text

from cli.plugin import Params, TableOpt
from framework import jobtype
from framework.errors import InvalidParams
from framework.records import Target
from framework.subtask import Batch


def stamp_options(
    table: TableOpt,
    value: Annotated[str, typer.Option(help="The text to stamp into column c.")],
) -> Params:
    """Stamp a value into column c of every row (installed from tinystamp)."""
    return {"table": table, "value": value}


class Stamp(jobtype.JobType):
    name = "stamp"
    submit_options = staticmethod(stamp_options)

    def validate(self, conn, params):
        if conn.execute(text("SELECT to_regclass(:t)"), {"t": params["table"]}).scalar() is None:
            raise InvalidParams(f"table {params['table']!r} does not exist; create it")
        return Target('"public"."items"', '"id"', dict(params))

    def prepare(self, conn, job):
        pass

    def write_batch(self, ctx, conn):
        upper = min(ctx.curr_key + ctx.job.batch_rows, ctx.end_key)
        n = conn.execute(text("UPDATE items SET c = :v WHERE id >= :lo AND id < :hi"),
                         {"v": ctx.job.params["value"], "lo": ctx.curr_key,
                          "hi": upper}).rowcount
        return Batch(upper, n)

    def advance(self, conn, job):
        pass

    def plan_revert(self, conn, job):
        return False

    def revert(self, conn, job):
        pass


def register():
    jobtype.register(Stamp())
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A directory that holds the ``tinystamp`` distribution, as installed."""
    (tmp_path / "tinystamp.py").write_text(textwrap.dedent(STAMP))
    info = tmp_path / "tinystamp-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinystamp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[reorg.job_types]\nstamp = tinystamp:register\n")
    return tmp_path


def _reorg(url: str, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert REORG, "the `reorg` command is not installed; run `pip install -e .`"
    return subprocess.run([REORG, "--db", url, *args], capture_output=True, text=True,
                          timeout=60, env=clean_env(PYTHONPATH=str(site)),
                          stdin=subprocess.DEVNULL)


def test_a_job_type_installed_from_another_package_is_listed_and_runs(
        items_db: str, site: Path, workers) -> None:
    listed = ok(_reorg(items_db, site, "submit", "--help"))
    assert "stamp" in listed and "installed from tinystamp" in listed
    for builtin in ("sql-update", "backfill", "copy", "checksum"):
        assert builtin in listed
    own = ok(_reorg(items_db, site, "submit", "stamp", "--help"))
    assert "--value" in own and "--priority" in own  # its options and every job's
    # Not installed: unknown to a process that does not see the package.
    assert "stamp" not in ok(_reorg(items_db, Path("/nonexistent"), "submit", "--help"))
    before = dump(items_db)
    missing = _reorg(items_db, site, "submit", "stamp", "--table", "items")
    assert "--value" in assert_one_error_line(missing, 2)
    assert dump(items_db) == before

    job_id = int(ok(_reorg(items_db, site, "submit", "stamp", "--table", "items",
                           "--value", "hello", "--rows-per-subtask", "100")).strip())
    # A real worker process, which finds the type through the same entry point.
    workers.start("w1", PYTHONPATH=os.pathsep.join([str(site), str(TESTS)]))
    ok(_reorg(items_db, site, "wait", str(job_id), "--timeout", "90"))
    db = Database(Settings(items_db))
    try:
        wait_until(lambda: scalar(db, "SELECT count(*) FROM items WHERE c = 'hello'")
                   == ITEMS_ROWS or None, 10, "every row stamped")
        assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM 'hello'") == 0
    finally:
        db.dispose()
