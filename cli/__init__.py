"""The ``reorg`` command: a thin typer layer over ``framework``.

Owns argument parsing, ``REORG_*`` environment variables, output formatting
(tables, ``--json``, live progress) and the single error handler
(``cli.errors``). Every decision about jobs, subtasks and nodes stays in
``framework``; SQL on reorg's system tables stays in ``framework.store``.
``reorg demo`` is the job types' (backfill/demo.py), joined like any of
their commands.

Knows no job type: never imports ``backfill`` or ``pyspark``; job types bring
their submit options, worker options, commands and status lines through
``cli.plugin``'s entry points. Never imported by ``framework`` or
``backfill`` (but ``cli.plugin``, by job types). Imports ``framework.localpg.embedded``
lazily, only when no database is configured. The web libraries (Starlette,
uvicorn, Jinja2) are imported only by ``cli.dashboard``, and only when
``reorg dashboard`` runs.
"""

import os
import signal
import sys

# Exit code of a Ctrl-C (cli.errors.INTERRUPTED, which imports far more).
_INTERRUPTED = 130


def _interrupted_while_starting(signum: int, frame: object) -> None:
    # Nothing has started yet (no connection, no output): the one line of
    # any Ctrl-C, not the traceback of whichever import it landed in.
    sys.stderr.write("error: interrupted\n")
    sys.stderr.flush()
    raise SystemExit(_INTERRUPTED)


def started() -> None:
    """From here on a Ctrl-C raises KeyboardInterrupt, which the command
    turns into its own line (``cli.main.run``)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Only in the `reorg` command itself, while its modules are imported (a third
# of a second, more on a loaded host): a program that imports cli keeps its
# own Ctrl-C.
if os.path.basename(getattr(sys, "argv", [""])[0]) == "reorg":
    signal.signal(signal.SIGINT, _interrupted_while_starting)
