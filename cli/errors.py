"""The one place that turns an exception into what the user sees.

Every failure prints exactly one line ``error: ...`` on stderr and exits
non-zero, never a traceback (unless ``--debug`` / ``REORG_DEBUG=1``). The exit
codes are the same for every command (README, "Exit codes"):

    0    done (``reorg wait``: the job succeeded)
    1    JOB_DID_NOT_SUCCEED: the job failed, was cancelled or reverted
    2    BAD_INPUT: usage errors, invalid parameters or settings, a refused
         request (second active job on a table, cancel of a finished job)
    3    TIMEOUT: ``reorg wait --timeout`` (or ``submit --wait --timeout``) passed first
         (``reorg checksum-report`` keeps its own 3 and 4: see backfill/checksum/cli.py)
    4    PAUSED_ON_FAILURE: ``reorg wait`` (or ``submit --wait``) on a job that
         paused because a subtask failed for good (``--on-failure pause``): it
         waits for ``reorg retry`` or ``reorg cancel``, not for its end
    5    OPERATIONAL: database unreachable or behind, an upgrade blocked by a
         lock, no PostgreSQL binaries, a PostgreSQL major reorg does not run on,
         Spark cannot start, database errors, and anything unexpected;
         ``reorg db current`` on a schema not at the head
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Sequence

import typer

from cli import logs
from framework.config import ConfigError
from framework.errors import InvalidParams, one_line
from framework.redact import redact

JOB_DID_NOT_SUCCEED = 1
BAD_INPUT = 2
TIMEOUT = 3
PAUSED_ON_FAILURE = 4
OPERATIONAL = 5
INTERRUPTED = 130
DEBUG_HINT = "rerun with --debug or REORG_DEBUG=1 to see the traceback"


class CliFailure(Exception):
    """A failure the CLI itself detects; printed as its message alone."""

    def __init__(self, message: str, exit_code: int = OPERATIONAL) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def debug_requested(args: Sequence[str]) -> bool:
    # Read from argv/env directly: the error may come from parsing itself,
    # before the global options callback has run.
    env = os.environ.get("REORG_DEBUG", "").strip().lower()
    return "--debug" in args or env in ("1", "true", "yes", "on", "y", "t")


def handle(exc: BaseException, *, debug: bool) -> int:
    """Print the one line for ``exc`` (and the traceback when debugging);
    return the exit code."""
    message, code, hint = classify(exc)
    if debug and code != 0 and not isinstance(exc, typer.TyperException):
        print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
    if message:
        line = f"error: {message}" + (f" ({hint})" if hint and not debug else "")
        if logs.json_active():  # `reorg worker --log-format json`: one JSON object a line
            logging.getLogger("reorg.cli").error("%s", line)
        else:
            print(line, file=sys.stderr, flush=True)
    return code


def classify(exc: BaseException) -> tuple[str, int, str | None]:
    """(one-line message, exit code, hint) for an exception."""
    # Imported when a run fails, not by every run: `reorg status` needs
    # neither the local server's module nor the job store's writes.
    from framework.db import DatabaseUnreachable, SchemaBehind
    from framework.localpg.cluster import PostgresError, PostgresNotFound
    from framework.migrate import UpgradeBlocked
    from framework.pgversion import UnsupportedServer
    from framework.store.jobs import ActiveJobExists

    if isinstance(exc, CliFailure):
        return one_line(str(exc), limit=None), exc.exit_code, None
    if isinstance(exc, typer.TyperException):  # click usage errors, vendored by typer
        return _usage_error(exc)
    if isinstance(exc, KeyboardInterrupt | typer.Abort):
        return "interrupted", INTERRUPTED, None
    if isinstance(exc, InvalidParams | ConfigError | ActiveJobExists):
        return one_line(str(exc), limit=None), BAD_INPUT, None
    if isinstance(exc, DatabaseUnreachable | SchemaBehind | UpgradeBlocked | PostgresNotFound
                  | PostgresError | UnsupportedServer):
        return one_line(str(exc), limit=None), OPERATIONAL, None
    if type(exc).__name__ == "SparkUnavailable":  # by name: importing it would load backfill.spark
        return one_line(str(exc), limit=None), OPERATIONAL, None
    if _database_error(exc):
        return f"database error: {one_line(exc, limit=None)}", OPERATIONAL, DEBUG_HINT
    # Never the class name (users cannot act on `_JvmDidNotStart`): its message,
    # and the traceback with --debug.
    return f"unexpected failure: {one_line(str(exc), limit=None)}", OPERATIONAL, DEBUG_HINT


def _database_error(exc: BaseException) -> bool:
    """A driver's error, raised through SQLAlchemy or by psycopg directly
    (``framework.directdb``). Looked up in ``sys.modules``: a library that was
    never imported raised nothing, and importing it here would cost every
    failing command its import time."""
    sa, psycopg = sys.modules.get("sqlalchemy"), sys.modules.get("psycopg")
    return bool((sa is not None and isinstance(exc, sa.exc.DBAPIError))
                or (psycopg is not None and isinstance(exc, psycopg.Error)))


def _usage_error(exc: typer.TyperException) -> tuple[str, int, str | None]:
    ctx = getattr(exc, "ctx", None)
    code = int(getattr(exc, "exit_code", BAD_INPUT))
    # Matched by name: click's class lives in typer's private vendored copy.
    # Its message is the help text; typer's rich formatter has already printed
    # it while building that message and left the message empty.
    if type(exc).__name__ == "NoArgsIsHelpError":
        if exc.format_message().strip():
            print(exc.format_message())
        return "", BAD_INPUT, None
    hint = f"see `{ctx.command_path} --help`" if ctx is not None else None
    return one_line(exc.format_message(), limit=None), code, hint

