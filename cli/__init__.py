"""The ``reorg`` command: a thin typer layer over ``framework``.

Owns argument parsing, ``REORG_*`` environment variables, output formatting
(tables, ``--json``, live progress) and the single error handler
(``cli.errors``). Every decision about jobs, subtasks and nodes stays in
``framework``; SQL stays in ``framework.store`` (the one exception, a read of
the history table, is marked in ``cli.history``).

Never imported by ``framework`` or ``backfill``. Imports ``framework.localpg.embedded``
lazily, only when no database is configured.
"""
