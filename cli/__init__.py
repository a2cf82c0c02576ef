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
