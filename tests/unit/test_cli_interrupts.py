"""Ctrl-C of any ``reorg`` command: one line and exit 130, never silence or a
traceback (``status --watch``: quiet). The acceptance tests
(test_cli_waits.py) send real SIGINTs to ``submit --wait`` and ``status
--watch``; these cover every other command and the start-up."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli.context import CliState
from cli.main import run

URL = "postgresql://nobody@127.0.0.1:1/none"  # never reached: the Ctrl-C comes first


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def test_a_ctrl_c_no_command_explains_is_one_line_and_exit_130(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(CliState, "direct_database", _interrupt)
    assert run(["--db", URL, "cancel", "1"]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_the_database_libraries_warnings_do_not_add_lines() -> None:
    """psycopg warns through logging when its cancel of an interrupted query
    fails; with no log configured, Python would print that on stderr. (In a
    process of its own: pytest's log capture would hide it.)"""
    code = (
        "import logging, sys\n"
        "from cli.context import CliState\n"
        "from cli.main import run\n"
        "def cancel_failed(*_):\n"
        "    logging.getLogger('psycopg').warning('query cancellation failed: timeout')\n"
        "    logging.getLogger('sqlalchemy.pool.impl.QueuePool').error('Exception during reset')\n"
        "    raise KeyboardInterrupt\n"
        "CliState.direct_database = cancel_failed\n"
        f"sys.exit(run(['--db', {URL!r}, 'cancel', '1']))\n")
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
    assert (ended.returncode, ended.stderr) == (130, "error: interrupted\n")


def test_a_ctrl_c_of_submit_before_it_wrote_anything_says_nothing_was_submitted(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(CliState, "database", _interrupt)
    assert run(["--db", URL, "submit", "sql-update", "--table", "t", "--set", "c=1"]) == 130
    assert capsys.readouterr() == ("", "error: interrupted; nothing was submitted\n")


def test_a_ctrl_c_of_status_watch_while_it_connects_is_quiet(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(CliState, "direct_database", _interrupt)
    assert run(["--db", URL, "status", "--watch"]) == 130
    assert capsys.readouterr().err == ""


def _sigint_as_from_a_shell() -> None:
    """In the child: SIGINT at its default and not blocked, as a shell starts
    a command. Python installs its KeyboardInterrupt only over the default,
    and a child inherits an ignored or blocked SIGINT from the test process
    (a CI run once gave one: the script slept its 10 s through the signal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("name", ["reorg", "other"])
def test_a_ctrl_c_while_reorg_starts_is_one_line_in_reorg_alone(tmp_path: Path, name: str) -> None:
    """The `reorg` script imports cli first: a Ctrl-C during the imports that
    follow ends it in one line. Any other program importing cli keeps
    Python's own Ctrl-C."""
    script = tmp_path / name
    script.write_text("import os, signal, time\nimport cli\n"
                      "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(10)\n")
    ended = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=60, preexec_fn=_sigint_as_from_a_shell)
    if name == "reorg":
        assert (ended.returncode, ended.stderr) == (130, "error: interrupted\n")
    else:
        assert ended.returncode != 130 and "KeyboardInterrupt" in ended.stderr
