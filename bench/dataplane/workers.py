"""``reorg worker`` processes: start one as the ``reorg`` command does, wait
until it is registered and has Spark up, stop it, or kill it with its JVM."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.dataplane import workerlog
from bench.dataplane.errors import BenchError
from bench.dataplane.proctree import RssSampler, launch_times, process_tree
from bench.dataplane.records import WORKER_SLOTS
from bench.dataplane.reorg_cli import REPO, clean_env, reorg

# `reorg worker` exactly as the command runs it, with one logger raised that
# only observes: each committed batch's figures as one JSON line. Plain --debug
# would also log every py4j message, which slows the worker down.
WORKER_BOOT = (f"import logging; logging.getLogger({workerlog.BATCH_LOGGER!r}).setLevel(logging.DEBUG); "
               "from cli.main import main; main()")


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    node_id: str
    log_path: Path
    launched: float  # epoch seconds
    sampler: RssSampler
    registered_after: float = float("nan")
    spark_ready_after: float | None = None  # launch -> SparkSession started (warm-up)
    spark_seconds: float | None = None  # its JVM's launch -> SparkSession started

    def spark_start_seconds(self, ready_at: float) -> float | None:
        """How long the SparkSession that was ready at ``ready_at`` took to
        start, measured from outside: from its JVM's launch (the latest
        ``java`` in the worker's process tree started by then)."""
        launched = [t for t in launch_times(self.proc.pid, "java") if t <= ready_at + 0.02]
        return max(ready_at - launched[-1], 0.0) if launched else None


def start_worker(url: str, node_id: str, log_dir: Path, *, spark_warmup: bool = False) -> Worker:
    """``spark_warmup``: the worker starts its SparkSession at start-up
    (``--spark-warmup``), as a service running Spark jobs would, so the
    benchmark's clock starts with Spark up; else it starts Spark lazily."""
    log_path = log_dir / f"{node_id}.log"
    warmup = ["--spark-warmup"] if spark_warmup else []
    with open(log_path, "wb") as log:
        launched = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_BOOT, "worker", "--slots", str(WORKER_SLOTS),
             "--node-id", node_id, *warmup],
            cwd=REPO, env=clean_env(REORG_DATABASE_URL=url), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sampler = RssSampler(proc.pid)
    sampler.start()
    worker = Worker(proc, node_id, log_path, launched, sampler)
    try:
        wait_registered(url, worker)
    except BaseException:
        kill_tree(worker)
        raise
    print(f"    worker {node_id} (pid {proc.pid}) registered after "
          f"{worker.registered_after:.2f} s", flush=True)
    return worker


@contextlib.contextmanager
def running_worker(url: str, node_id: str, log_dir: Path, *,
                   spark_warmup: bool = False) -> Iterator[Worker]:
    worker = start_worker(url, node_id, log_dir, spark_warmup=spark_warmup)
    try:
        yield worker
    finally:
        stop_worker(worker)


def wait_registered(url: str, worker: Worker, timeout: float = 120.0) -> None:
    """Poll `reorg nodes --json` until the worker is listed; its registration
    time is the node row's started_at (database clock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            raise BenchError(f"worker {worker.node_id} exited with {worker.proc.returncode}; "
                             f"see {worker.log_path}")
        nodes = json.loads(reorg(url, "nodes", "--json").stdout or "[]")
        mine = [n for n in nodes if n["node_id"] == worker.node_id]
        if mine:
            started = dt.datetime.fromisoformat(mine[0]["started_at"]).timestamp()
            worker.registered_after = started - worker.launched
            return
        time.sleep(0.1)
    raise BenchError(f"worker {worker.node_id} did not register within {timeout:.0f}s")


def wait_spark_ready(worker: Worker, timeout: float = 90.0) -> None:
    """Wait until the worker's own Spark warm-up has started its SparkSession
    (a long-running worker has Spark up before jobs arrive). A worker that
    does not warm up on its own starts Spark in its first job instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = workerlog.stamped_lines(worker.log_path)
        if failed := workerlog.spark_failure(lines):
            raise BenchError(f"worker {worker.node_id}: {failed}")
        if ready := workerlog.spark_ready_times(lines):
            worker.spark_seconds = worker.spark_start_seconds(ready[0])
            worker.spark_ready_after = ready[0] - worker.launched
            took = ("" if worker.spark_seconds is None
                    else f" (took {worker.spark_seconds:.2f} s from its JVM's launch)")
            print(f"    its SparkSession started {worker.spark_ready_after:.2f} s after launch"
                  f"{took}", flush=True)
            return
        if worker.proc.poll() is not None:
            raise BenchError(f"worker {worker.node_id} exited; see {worker.log_path}")
        time.sleep(0.1)
    print(f"    worker did not start Spark within {timeout:.0f} s; its first job will", flush=True)


def stop_worker(worker: Worker) -> None:
    """SIGTERM (drain, deregister); SIGKILL if it does not exit in a minute."""
    if worker.proc.poll() is None:
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(60)
        except subprocess.TimeoutExpired:
            kill_tree(worker)
    worker.sampler.stop()


def kill_tree(worker: Worker) -> None:
    """SIGKILL the worker and its JVM at once, as a crashed host would lose them."""
    if worker.proc.poll() is None:
        for pid in process_tree(worker.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.proc.wait()
    worker.sampler.stop()
