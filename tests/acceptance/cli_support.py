"""Helpers for the ``reorg`` acceptance tests (this module holds no tests).

The tests run the
installed ``reorg`` command in a process of its own, always with ``--db``,
and an environment cleared of ``REORG_*`` so nothing reaches the embedded
default: ``reorg()`` forks it from a warm process (``support.forkserver``),
``Running`` starts it cold, as a terminal or a Ctrl-C needs.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import threading
from typing import Any

import psycopg
from psycopg import sql
from support import forkserver, make_items, wait_until
from support.processes import REORG, clean_env

from framework.config import Settings
from framework.db import Database
from framework.submit import SubmitRequest
from framework.submit import submit as core_submit

SYSTEM_SCHEMA = "reorg"


def reorg(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``reorg --db URL ARGS...`` and return its result (never raises on exit code)."""
    assert REORG, "the `reorg` command is not installed; run `pip install -e .`"
    return forkserver.run([REORG, "--db", url, *args], env=clean_env(), timeout=timeout)


class Running:
    """``reorg --db URL ARGS...`` running, its stdout (a pipe, or a terminal
    with ``terminal=True``) and stderr read as they come, to the end: a
    process writing to a pipe or terminal nobody reads would block in that
    write (a ``status --watch`` redraws four times a second)."""

    def __init__(self, url: str, *args: str, terminal: bool = False, **env: str) -> None:
        assert REORG, "the `reorg` command is not installed; run `pip install -e .`"
        main, stdout = pty.openpty() if terminal else (-1, subprocess.PIPE)
        self.proc = subprocess.Popen([REORG, "--db", url, *args], stdout=stdout,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     env=clean_env(**env))
        if terminal:
            os.close(stdout)
        else:
            assert self.proc.stdout is not None
            main = self.proc.stdout.fileno()
        assert self.proc.stderr is not None
        self._stdout, self._stderr = main, self.proc.stderr.fileno()
        self._chunks: dict[int, list[bytes]] = {main: [], self._stderr: []}
        self._terminal = terminal
        self._readers = [threading.Thread(target=self._read, args=(fd,), daemon=True)
                         for fd in self._chunks]
        for reader in self._readers:
            reader.start()

    def _read(self, fd: int) -> None:
        try:
            while chunk := os.read(fd, 65536):
                self._chunks[fd].append(chunk)
        except OSError:  # a terminal whose last writer has gone (EIO)
            pass

    def stdout(self) -> str:
        return b"".join(self._chunks[self._stdout]).decode(errors="replace")

    def stderr(self) -> str:
        return b"".join(self._chunks[self._stderr]).decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 60) -> None:
        """Until ``text`` is on stdout; fails if the process ends first."""
        wait_until(lambda: text in self.stdout() or self.proc.poll() is not None, timeout,
                   f"{text!r} on stdout")
        assert text in self.stdout(), (self.proc.returncode, self.stdout(), self.stderr())

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C (SIGINT); its exit code once it has ended, all its output read."""
        self.proc.send_signal(signal.SIGINT)
        return self.end(timeout)

    def end(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout:g}s on: {self.stderr()}") from None
        for reader in self._readers:
            reader.join(timeout)
        return code

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for reader in self._readers:
            reader.join(10)
        if self._terminal:
            os.close(self._stdout)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """stdout of a run that must have succeeded."""
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def reorg_json(url: str, *args: str) -> Any:
    return json.loads(ok(reorg(url, *args, "--json")))


def submit(url: str, *args: str) -> int:
    return int(ok(reorg(url, "submit", "sql-update", *args)).strip())


def job_status(url: str, job_id: int) -> dict[str, Any]:
    return reorg_json(url, "status", str(job_id))[0]


def assert_one_error_line(result: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """The contract for every rejected command: one ``error:`` line on stderr,
    the expected non-zero exit code, no traceback; returns the line."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{result.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == exit_code, f"exit {result.returncode}: {lines[0]}"
    return lines[0]


# -- the user's table and snapshots of every table ------------------------------


def dump(url: str, *, schemas: tuple[str, ...] = (SYSTEM_SCHEMA, "public"),
         skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every table of ``schemas`` (columns and sorted rows), to compare before
    and after a command. Tables a command might create show up too."""
    snapshot: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema = ANY(%s) ORDER BY 1, 2", (list(schemas),)).fetchall()
        for schema, table in tables:
            if table in skip:
                continue
            name = sql.Identifier(schema, table)
            columns = conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                (schema, table)).fetchall()
            # Rows as text: exact, and safe for values psycopg cannot load
            # (the owner lease starts at '-infinity').
            rows = conn.execute(sql.SQL("SELECT t::text FROM {} t").format(name)).fetchall()
            snapshot[f"{schema}.{table}"] = (columns, sorted(r[0] for r in rows))
    return snapshot


def seed_items_db(url: str, rows: int) -> str:
    """``items`` (``rows`` rows) and a queued job on ``other`` (10 rows), so the
    system tables have rows a bad command could touch."""
    make_items(url, rows)
    make_items(url, 10, table="other")
    # In this process, through the function `reorg submit` calls: a `reorg`
    # process per test's setup cost more than the test's own command.
    db = Database(Settings(url))
    try:
        core_submit(db, SubmitRequest("sql-update", {"table": "other", "set": "c=b"}))
    finally:
        db.dispose()
    return url
