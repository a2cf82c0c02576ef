"""Starting Spark in a worker before its first Spark subtask (the Spark job
types' per-worker start hook, ``framework.jobtype.start_workers``)."""

from __future__ import annotations

import logging
import threading

from framework.errors import one_line

log = logging.getLogger("reorg.worker")
_started = threading.Lock()


def start_in_background() -> None:
    """Start the process's SparkSession on a thread of its own, once."""
    if _started.acquire(blocking=False):
        threading.Thread(target=warm_up, name="spark-warmup", daemon=True).start()


def warm_up() -> None:
    # Spark takes seconds to start; pay it while the node is idle, not inside
    # the first subtask's lease. A failure here is only logged: subtasks that
    # need Spark will fail with the same one-line reason.
    from backfill.spark import cds, session

    try:
        session.get_spark()
    except Exception as exc:
        log.warning("Spark did not start: %s", one_line(exc))
        return
    # Once per host, build the class-data archive later JVMs start from
    # (this worker's next start, and every `reorg submit`'s dry run).
    try:
        cds.ensure_in_background(session.cds_archive(), session.settings_environ())
    except Exception as exc:  # only a speed-up: never stop the worker for it
        log.warning("not building a Spark class-data archive: %s", exc)
