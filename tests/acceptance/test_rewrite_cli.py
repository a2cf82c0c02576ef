"""``reorg submit rewrite`` as a user runs it: its options (``--like FILE``,
``--set`` repeated, ``--keep-old``), a dry run printing every state's
statements, bad input as one ``error:`` line with exit 2 and every table as
it was.

The job type is named through ``REORG_JOB_TYPES`` here: in a checkout
installed before it existed, its entry point is not installed yet."""

from __future__ import annotations

import subprocess

from cli_support import assert_one_error_line, dump, ok
from support.processes import REORG, clean_env

ITEMS_ROWS = 200
ENV = {"REORG_JOB_TYPES": "backfill.rewrite.job:register"}


def reorg(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert REORG, "the `reorg` command is not installed; run `pip install -e .`"
    return subprocess.run([REORG, "--db", url, *args], capture_output=True, text=True,
                          timeout=60, env=clean_env(**ENV), stdin=subprocess.DEVNULL)


def test_a_dry_run_with_a_like_file_prints_every_state_and_changes_nothing(items_db, tmp_path):
    shape = tmp_path / "shape.sql"
    shape.write_text("CREATE TABLE items (id int PRIMARY KEY, a int, b text, c text, d text)"
                     " PARTITION BY RANGE (id);\n"
                     "CREATE TABLE items_p1 PARTITION OF items FOR VALUES FROM (MINVALUE) TO (100);\n"
                     "CREATE TABLE items_p2 PARTITION OF items FOR VALUES FROM (100) TO (MAXVALUE);\n")
    before = dump(items_db)
    out = ok(reorg(items_db, "submit", "rewrite", "--table", "items", "--like", str(shape),
                   "--set", "d=upper(b)", "--set", "c=lower(b)", "--dry-run"))
    assert "dry run, nothing submitted" in out
    for state in ("prepare (write-only", "copy (write-reorg", "build (write-reorg",
                  "catch-up (write-reorg", "verify (write-reorg", "swap (public",
                  "swapped (public", "cleanup", "rollback before the swap"):
        assert f"\n{state}" in out, state
    assert "PARTITION OF" in out and "(upper(b)" in out and "(lower(b)" in out
    assert dump(items_db) == before


def test_bad_input_is_one_line_exit_2_and_changes_nothing(items_db, tmp_path):
    before = dump(items_db)
    for args, says in [
        (["--like", str(tmp_path / "missing.sql")], "--like "),
        (["--alter", "DROP COLUMN b", "--keep-old", "1h"],
         "--keep-old: column b is not in the new shape"),
        (["--keep-old", "later"], "--keep-old 'later' is not a duration"),
        (["--set", "nope"], "--set 'nope' is not COLUMN=EXPRESSION"),
    ]:
        line = assert_one_error_line(reorg(items_db, "submit", "rewrite", "--table", "items",
                                           *args), 2)
        assert says in line, line
        assert dump(items_db) == before, args
