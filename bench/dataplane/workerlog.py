"""What a worker's log says: when its SparkSession was ready, and the figures
of each batch it committed (one JSON object a batch, logged by reorg's Spark
pipeline on the ``reorg.spark.batches`` logger at DEBUG)."""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
from pathlib import Path
from typing import Any

from bench.dataplane.records import Batches

BATCH_LOGGER = "reorg.spark.batches"
# `reorg worker` logs "%(asctime)s %(levelname)s %(name)s: %(message)s".
LOG_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
BATCH_MARK = f" {BATCH_LOGGER}: batch "
SPARK_READY_RE = re.compile(r"Spark \S+ started: master ")  # backfill.spark.session, INFO
SPARK_FAILED_RE = re.compile(r"Spark did not start.*")  # the worker's warm-up, WARNING


def log_time(stamp: str) -> float:
    """A worker log's asctime (local time) as epoch seconds."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def stamped_lines(path: Path, since: float = 0.0, until: float = float("inf")
                  ) -> list[tuple[float, str]]:
    """(epoch seconds, line) of the log's lines stamped within [since, until]."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        match = LOG_TIME_RE.match(line)
        if match:
            stamp = log_time(match.group(1))
            if since <= stamp <= until:
                out.append((stamp, line))
    return out


def spark_failure(lines: list[tuple[float, str]]) -> str | None:
    return next((m.group(0) for _, line in lines if (m := SPARK_FAILED_RE.search(line))), None)


def spark_ready_times(lines: list[tuple[float, str]]) -> list[float]:
    """When the worker's SparkSession (re)started, as its own INFO line says."""
    return [stamp for stamp, line in lines if SPARK_READY_RE.search(line)]


def batch_figures(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """The per-batch JSON objects: subtask, lo, hi, scanned, rows,
    read_seconds, apply_seconds (and for backfill rounds, recomputed)."""
    return [json.loads(line.split(BATCH_MARK, 1)[1]) for _, line in lines if BATCH_MARK in line]


def batch_stats(lines: list[tuple[float, str]], subtask_ids: set[int]) -> Batches:
    found = [b for b in batch_figures(lines) if b["subtask"] in subtask_ids]
    if not found:
        return Batches()
    rows = [int(b["rows"]) for b in found]
    reads = [float(b["read_seconds"]) for b in found]
    merges = [float(b["apply_seconds"]) for b in found]
    return Batches(len(found), statistics.median(rows), max(rows), statistics.median(reads),
                   statistics.median(merges), sum(reads), sum(merges))
