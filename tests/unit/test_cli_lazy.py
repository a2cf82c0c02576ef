"""``reorg`` imports only the command groups a run names (cli.main.GROUPS)
and builds only the commands it names: the map must list every command of
every group, or a command would vanish."""

from __future__ import annotations

import importlib
import subprocess
import sys

import typer

from cli import plugin
from cli.main import GROUPS, build_app


def _commands(app: typer.Typer) -> set[str]:
    command = typer.main.get_command(app)
    if hasattr(command, "commands"):
        return set(command.commands)
    return {command.name}  # a group of one command


def test_the_group_map_names_every_command_of_its_module():
    for module, (name, commands) in GROUPS.items():
        group = importlib.import_module(f"cli.{module}").app
        found = {name} if name else _commands(group)
        assert found == set(commands), module
    contributed = set(plugin.commands())
    assert "checksum-report" in contributed  # a job type's command (backfill/checksum)
    assert _commands(build_app()) == {c for _, cs in GROUPS.values() for c in cs} | contributed


def test_a_named_command_is_built_alone_and_help_gets_all():
    assert _commands(build_app(["--db", "postgresql://x/y", "status", "7"])) == {"status"}
    assert _commands(build_app(["wait", "7", "--timeout", "5"])) == {"wait"}
    assert _commands(build_app(["db", "current"])) == {"db"}  # a named group: all of it
    assert _commands(build_app(["--help"])) == _commands(build_app())
    assert _commands(build_app(["--version"])) == set()  # eager: printed before any command


def test_a_job_type_command_is_loaded_alone_when_named():
    assert _commands(build_app(["checksum-report", "7"])) == {"checksum-report"}


def test_submit_of_one_type_imports_that_type_alone():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from cli.main import run; "
         "run(['submit', 'sql-update', '--help']); "
         "print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules "
         "if m == 'pyspark' or m.startswith(('backfill.sql_update', 'backfill.spark', "
         "'backfill.copy', 'backfill.checksum'))}))"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    assert loaded == "['backfill.sql_update']"


def test_status_imports_no_worker_submit_or_demo_code():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from cli.main import build_app; "
         "build_app(['status', '1']); "
         "print(sorted(m for m in sys.modules if m in ('cli.worker', 'backfill.demo', 'cli.submit', "
         "'framework.node', 'framework.metrics', 'pyspark')))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"



_PARSE_STATUS_AND_WAIT = """
import sys, typer
from cli.main import build_app
root = typer.main.get_command(build_app(["status", "wait"]))
ctx = root.make_context("reorg", ["--db", "postgresql://x/y", "status", "1", "--json"])
for name, args in (("status", ["1", "--json", "--limit", "3"]), ("wait", ["1", "--timeout", "5"])):
    root.get_command(ctx, name).make_context(name, args, parent=ctx)
print(sorted({m.split(".")[0] for m in sys.modules}
             & {"sqlalchemy", "pydantic", "rich", "alembic", "pyspark"}))
"""


def test_status_and_wait_parse_without_sqlalchemy_pydantic_rich_or_alembic():
    """``reorg status`` / ``reorg wait`` read through psycopg alone and print
    JSON or lines without rich (issue 9: status as a command ≤ 400 ms); a
    plain option needs no pydantic (``cli.coercion``). The status table and
    ``--watch`` import rich when they draw."""
    loaded = subprocess.run([sys.executable, "-c", _PARSE_STATUS_AND_WAIT],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
