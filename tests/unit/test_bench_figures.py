"""The per-batch figures reorg's Spark pipeline logs are the ones the data-plane
benchmark reads: one JSON object a batch on the ``reorg.spark.batches`` logger,
parsed by ``bench.dataplane.workerlog`` from a worker's log."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is not installed; `python -m pytest` adds it anyway
    sys.path.insert(0, str(ROOT))

from backfill.spark.pipeline import Batch, RangePipeline  # noqa: E402
from backfill.spark_backfill.batches import Merged, SubtaskRunner  # noqa: E402
from bench.dataplane import workerlog  # noqa: E402

# As `reorg worker` configures logging (cli.logs.TEXT_FORMAT).
WORKER_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def _worker_log(records: list[logging.LogRecord], path: Path) -> Path:
    path.write_text("".join(WORKER_FORMAT.format(r) + "\n" for r in records))
    return path


def _bare(cls: type) -> RangePipeline:
    """A pipeline with only what ``record`` reads (no session, no database)."""
    pipeline = cls.__new__(cls)
    pipeline.stats = []
    pipeline.ctx = SimpleNamespace(subtask_id=7)
    return pipeline


class _Plain(RangePipeline):
    compute = apply = None  # type: ignore[assignment]


@pytest.mark.parametrize("cls, result, rows", [
    (_Plain, None, 900),
    (SubtaskRunner, Merged(rows=850, rounds=1, recomputed=3), 850),
])
def test_bench_reads_the_figures_a_committed_batch_logs(cls, result, rows, caplog, tmp_path):
    pipeline = _bare(cls)
    with caplog.at_level(logging.DEBUG, logger=workerlog.BATCH_LOGGER):
        pipeline.record(Batch(lo=100, hi=1000, scanned=900, payload=None, seconds=0.25),
                        result, 0.5)
        pipeline.record(Batch(lo=1000, hi=1900, scanned=900, payload=None, seconds=0.75),
                        result, 1.5)
    lines = workerlog.stamped_lines(_worker_log(caplog.records, tmp_path / "worker.log"))

    figures = workerlog.batch_figures(lines)
    assert [(f["subtask"], f["lo"], f["hi"], f["rows"]) for f in figures] == [
        (7, 100, 1000, rows), (7, 1000, 1900, rows)]
    stats = workerlog.batch_stats(lines, {7})
    assert (stats.count, stats.rows_max, stats.read_median, stats.merge_total) == (2, rows, 0.5, 2.0)
    assert workerlog.batch_stats(lines, {8}).count == 0


def test_no_figures_are_formatted_unless_the_logger_is_raised(caplog):
    pipeline = _bare(_Plain)
    with caplog.at_level(logging.INFO):
        pipeline.record(Batch(1, 2, 1, None, 0.1), None, 0.1)
    assert not caplog.records and len(pipeline.stats) == 1
