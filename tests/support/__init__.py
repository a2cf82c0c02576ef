"""Test support shared by every suite: import as ``from support import ...``
(pytest puts tests/ on sys.path: it holds conftest.py and no __init__.py).

- ``support.db``: databases, the ``items`` table, query helpers, job waits,
  ``TERMINAL`` (from framework.states).
- ``support.fill``: ``test-fill``, the job type the framework's tests run.
- ``support.processes``: ``reorg worker`` processes (``Workers``).
- ``support.forkserver``: ``reorg`` commands and workers forked from a warm
  process, not started cold.
- ``support.fixtures``, ``support.spark``: pytest plugins (named in
  tests/conftest.py): migrated databases, settings, nodes, workers, gates;
  the SparkSession, fake leases and ``JobKind`` for the Spark data plane.

Never imported by production code.
"""

from support.db import (
    TERMINAL,
    busy_sessions,
    catalogue,
    create_database,
    database_url,
    drop_database,
    execute,
    held_by,
    job_of,
    make_items,
    rows,
    scalar,
    snapshot,
    statements_sent,
    subtask_ranges,
    table_rows,
    wait_history,
    wait_state,
    wait_until,
)
from support.fill import fill, started_fill
from support.processes import WorkerProcess, Workers

__all__ = [
    "TERMINAL", "WorkerProcess", "Workers", "busy_sessions", "catalogue", "create_database", "database_url",
    "drop_database", "execute", "fill", "held_by", "job_of", "make_items", "rows", "scalar", "snapshot",
    "started_fill", "statements_sent", "subtask_ranges", "table_rows", "wait_history", "wait_state",
    "wait_until",
]
