"""A node's Prometheus metrics: the metric objects, and the few calls the
worker pool and the node make to update them.

Updating a metric is an in-memory increment, so the hot path (one call per
batch) costs next to nothing; nothing is served unless ``serve`` is called
(``reorg worker --metrics-port``). Without ``prometheus_client`` installed the
metrics are no-ops and ``serve`` refuses with one line.

Series per node (a scrape reads one node; sum over nodes in the query):

    reorg_rows_processed_total{job_id,job_type}      rows of committed batches
    reorg_batches_total{job_id,job_type,outcome}     committed | rolled_back | refused
    reorg_batch_duration_seconds{job_type}           histogram, claim/previous batch to commit
    reorg_subtasks_total{job_type,outcome}           succeeded | released | lost | retry | failed
    reorg_subtasks_running                           subtasks this node runs now
    reorg_leases_lost_total{reason}                  renewal_refused | untrusted | checkpoint_refused
    reorg_is_owner                                   1 on the owner node
    reorg_job_progress_ratio{job_id}                 owner only: the job's percent / 100 (1 when succeeded)
    reorg_job_rows_total{job_id}                     owner only: the job's rows done

The job gauges are the figures ``reorg status`` shows (``store.progress``: of
a type of several steps, the percent of all its steps, and the rows of its
current range step).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

try:
    import prometheus_client as prom
except ImportError:  # pragma: no cover - the package depends on it; a stripped install may not
    prom = None  # type: ignore[assignment]


class _Noop:
    def labels(self, *args: Any, **kwargs: Any) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None: ...
    def dec(self, amount: float = 1) -> None: ...
    def set(self, value: float) -> None: ...
    def observe(self, value: float) -> None: ...
    def remove(self, *labels: Any) -> None: ...


def _make(kind: str, name: str, doc: str, labels: tuple[str, ...] = (), **kw: Any) -> Any:
    if prom is None:
        return _Noop()
    return getattr(prom, kind)(name, doc, labels, **kw)


ROWS = _make("Counter", "reorg_rows_processed", "Rows of batches this node committed.",
             ("job_id", "job_type"))
BATCHES = _make("Counter", "reorg_batches", "Batches this node checkpointed, by outcome "
                "(committed, rolled_back, refused: the lease was lost).",
                ("job_id", "job_type", "outcome"))
BATCH_SECONDS = _make(
    "Histogram", "reorg_batch_duration_seconds",
    "Seconds from the subtask's start (or its previous batch) to a batch's commit.",
    ("job_type",), buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
SUBTASKS = _make("Counter", "reorg_subtasks", "Subtasks this node ran, by outcome.",
                 ("job_type", "outcome"))
RUNNING = _make("Gauge", "reorg_subtasks_running", "Subtasks this node is running now.")
LEASES_LOST = _make("Counter", "reorg_leases_lost",
                    "Subtask leases this node lost (its work on them was abandoned).",
                    ("reason",))
# Every reason from the start, at 0: an alert on rate(reorg_leases_lost_total)
# needs the series to exist before the first loss.
for _reason in ("renewal_refused", "untrusted", "checkpoint_refused"):
    LEASES_LOST.labels(_reason)
IS_OWNER = _make("Gauge", "reorg_is_owner", "1 while this node is the elected owner.")
JOB_PROGRESS = _make("Gauge", "reorg_job_progress_ratio",
                     "Owner only: a job's progress as reorg status shows it, 0 to 1 "
                     "(1 when succeeded).", ("job_id",))
JOB_ROWS = _make("Gauge", "reorg_job_rows_total",
                 "Owner only: a job's rows done as reorg status shows them.", ("job_id",))

# Finished jobs keep their last figures on the owner's /metrics for a while
# (a scrape after the end still sees them), bounded so a long-lived owner
# does not grow a series per job forever.
KEEP_FINISHED_JOBS = 20
_shown: OrderedDict[str, bool] = OrderedDict()  # job id -> still live


def batch(job_id: int, job_type: str, outcome: str, rows: int = 0,
          seconds: float | None = None) -> None:
    BATCHES.labels(str(job_id), job_type, outcome).inc()
    if outcome == "committed":
        ROWS.labels(str(job_id), job_type).inc(rows)
        if seconds is not None:
            BATCH_SECONDS.labels(job_type).observe(seconds)


def subtask(job_type: str, outcome: str) -> None:
    SUBTASKS.labels(job_type, outcome).inc()


def lease_lost(reason: str) -> None:
    LEASES_LOST.labels(reason).inc()


def owner_jobs(is_owner: bool, jobs: list[dict[str, Any]]) -> None:
    """Set the owner's job gauges from ``jobs`` (rows of
    ``store.progress.jobs_progress``: the live jobs, and the ones that just
    ended); a node that is not the owner shows none."""
    IS_OWNER.set(1 if is_owner else 0)
    if not is_owner:
        for job_id in list(_shown):
            _forget(job_id)
        return
    for job in jobs:
        job_id = str(job["id"])
        # The figures `reorg status` shows (store.progress).
        JOB_PROGRESS.labels(job_id).set(job["percent"] / 100.0)
        JOB_ROWS.labels(job_id).set(job["rows_done"])
        _shown[job_id] = job["state"] not in ("succeeded", "cancelled", "reverted")
        _shown.move_to_end(job_id)
    finished = [j for j, live in _shown.items() if not live]
    for job_id in finished[:max(len(finished) - KEEP_FINISHED_JOBS, 0)]:
        _forget(job_id)


def shown_live_jobs() -> list[int]:
    """Jobs shown as live: the owner reads them once more when they end."""
    return [int(j) for j, live in _shown.items() if live]


def _forget(job_id: str) -> None:
    for gauge in (JOB_PROGRESS, JOB_ROWS):
        with contextlib.suppress(KeyError):
            gauge.remove(job_id)
    _shown.pop(job_id, None)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve Prometheus text at ``http://addr:port/metrics`` from a daemon thread."""
    if prom is None:
        raise RuntimeError("--metrics-port needs prometheus_client: pip install prometheus-client")
    prom.start_http_server(port, addr=addr)
