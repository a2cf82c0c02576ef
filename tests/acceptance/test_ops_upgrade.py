"""Upgrading reorg while it runs, and the embedded server's stop, through the
``reorg`` command: a schema upgraded by a newer reorg is named as such (not
"run `reorg db upgrade`"), and `reorg db stop` stops the embedded PostgreSQL
that a command without --db started."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cli_support import assert_one_error_line, dump, ok, reorg
from support import execute
from support.processes import REORG, clean_env

from framework.localpg.cluster import LocalPostgres, accepts_tcp
from framework.localpg.embedded import PORT_FILE
from framework.revisions import head_revision

OPERATIONAL = 5
FUTURE = "9999_from_a_newer_reorg"


def test_a_schema_upgraded_by_a_newer_reorg_is_named_so(migrated_db: str) -> None:
    url = migrated_db
    execute(url, f"UPDATE reorg.alembic_version SET version_num = '{FUTURE}'")
    before = dump(url)
    for command in (["status"], ["db", "upgrade"], ["submit", "sql-update", "--table", "x",
                                                    "--set", "c=1"]):
        line = assert_one_error_line(reorg(url, *command), OPERATIONAL)
        assert f"at revision {FUTURE}, newer than this version of reorg knows" in line, line
        assert head_revision() in line
    assert f"newer than this version's head {head_revision()}" in assert_one_error_line(
        reorg(url, "db", "current"), OPERATIONAL)
    assert dump(url) == before


def _embedded(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``reorg ARGS`` without --db: the embedded default, kept in ``directory``."""
    assert REORG
    return subprocess.run([REORG, *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL,
                          env=clean_env(REORG_EMBEDDED_DIR=str(directory)))


def test_db_stop_stops_the_embedded_server_a_command_started(scratch_dir: Path) -> None:
    scratch_dir.chmod(0o755)  # run as root, the server's own user must reach it
    where = scratch_dir / "embedded"
    try:
        ok(_embedded(where, "status"))  # starts (and upgrades) the embedded server
        port = int((where / PORT_FILE).read_text())
        assert accepts_tcp(port)
        assert ok(_embedded(where, "db", "stop")).strip() == (
            f"embedded PostgreSQL stopped; its data stays in {where}")
        assert not accepts_tcp(port) and not LocalPostgres(where, port).is_running()
        assert ok(_embedded(where, "db", "stop")).strip() == (
            f"embedded PostgreSQL is not running (data directory {where})")
        # The next command starts it again, its data kept.
        assert "no jobs" in ok(_embedded(where, "status"))
    finally:
        _embedded(where, "db", "stop")
