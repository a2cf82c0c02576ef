"""``reorg submit`` options the built-in job types share (``cli.plugin``
explains how a job type brings its options). Imported by ``reorg submit``
alone, never by a worker: typer stays out of the data plane."""

from __future__ import annotations

from typing import Annotated

import typer

SetOpt = Annotated[str, typer.Option("--set", help="COLUMN=EXPRESSION to write into each row.")]
WhereOpt = Annotated[str | None, typer.Option("--where", help="Only rows matching this predicate.")]
AddColumnOpt = Annotated[str | None, typer.Option(
    "--add-column", help="COLUMN:TYPE to create first (dropped again on rollback).")]
