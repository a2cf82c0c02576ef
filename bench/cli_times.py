"""How long the ``reorg`` command takes (issue 9): ``reorg submit`` of every
job type (target ≤ 1.5 s, Spark types included) and ``reorg status JOB`` as a
command (target ≤ 400 ms), for this checkout and, in the same run, for a
baseline checkout (``--baseline PATH``, e.g. a ``git worktree`` of main).

    python -m bench.cli_times --baseline /tmp/reorg-main

One throwaway PostgreSQL (or ``--db``). ``--phases`` phases per checkout,
the checkouts alternating (so load that drifts during the run favours
neither); a phase starts one ``reorg worker --slots 2 --spark-warmup`` of that
checkout (a submit of a Spark type waits for its owner's analysis), submits
each Spark type once (a worker's first analysis also warms its JVM's code
paths: reported apart), then runs ``--repeats`` rounds of: a submit of each
type (each job waited for before the next), ``reorg status JOB --json``,
``reorg status JOB`` (the table), and
``python -c pass`` (the floor of any Python process on the machine right
then). Each command is a subprocess run as a user runs it, from its own
checkout (``python -m cli.main`` with that directory first on the path); wall
time and the CPU time the process used (user + system, much steadier than
wall time on a shared machine) are reported, medians over the rounds, with
the load average. Printed as markdown, not written: copy what matters into
docs/benchmarks.md.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.dataplane.reorg_cli import REPO, clean_env
from bench.dataplane.server import add_fast_server, database, execute
from bench.dataplane.submit_times import SMALL, TWIN, submit_arguments

JOB_TYPES = ("sql-update", "checksum", "backfill", "copy")
SPARK_TYPES = ("backfill", "copy")


@dataclass
class Times:
    """Wall and CPU seconds of each run of one measure."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def cell(self) -> str:
        if not self.wall:
            return "–"
        return (f"{statistics.median(self.wall):.2f} s (min {min(self.wall):.2f}), "
                f"CPU {statistics.median(self.cpu):.2f} s")


@dataclass
class Run:
    """One command as a subprocess, from one checkout."""

    checkout: Path
    url: str

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cli.main", "--db", self.url, *args]

    def env(self) -> dict[str, str]:
        # Its own checkout first on the path: `-m cli.main` and everything it
        # imports come from there, not from the installed (editable) tree.
        return clean_env(PYTHONPATH=str(self.checkout))

    def timed(self, argv: list[str], times: Times | None) -> str:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run(argv, cwd=self.checkout, env=self.env(), capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"error: `{' '.join(argv[3:])}` exited {done.returncode}: "
                             f"{(done.stderr or done.stdout).strip()[-1500:]}")
        if times is not None:
            times.wall.append(wall)
            times.cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        return done.stdout

    def reorg(self, *args: str, times: Times | None = None) -> str:
        return self.timed(self.command(*args), times)


def _ready(log: bytes, warms_analysis: bool) -> bool:
    """Spark is up, and, for a checkout whose worker warms Spark's analysis
    paths up after that (and logs when done), that warm-up is over."""
    if not warms_analysis:
        return b"Spark " in log and b" started" in log
    return b"Spark warmed up for a first analysis" in log or b"did not warm up" in log


@contextmanager
def worker(run: Run, log: Path) -> Iterator[None]:
    """``reorg worker --spark-warmup`` of the run's checkout, Spark started."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(run.command("worker", "--slots", "2", "--spark-warmup"),
                                cwd=run.checkout, env=run.env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        # Ready once Spark is up and has run its warm-up analysis (a worker
        # that does not log one, e.g. a baseline before it existed: once up).
        warms = "warm_analysis" in (run.checkout / "backfill/spark/warmup.py").read_text()
        while not _ready(log.read_bytes(), warms):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"error: the worker did not start Spark; see {log}")
            time.sleep(0.2)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(run: Run, tag: str, repeats: int, log_dir: Path,
            times: dict[str, Times]) -> None:
    """Add to ``times`` the measures of one checkout; ``tag`` names its
    tables and log."""
    print(f"{tag}: {run.checkout} (load average {os.getloadavg()[0]:.1f})", flush=True)
    with worker(run, log_dir / f"worker-{tag}.log"):
        for job_type in SPARK_TYPES:  # the worker's first analysis of each type
            first = times.setdefault(f"first `reorg submit {job_type}`", Times())
            job = json.loads(run.reorg("submit", job_type, *submit_arguments(job_type, f"{tag}_w"),
                                       "--json", times=first))["id"]
            run.reorg("wait", str(job))
        for attempt in range(repeats):
            for job_type in JOB_TYPES:
                lap = times.setdefault(f"`reorg submit {job_type}`", Times())
                job = json.loads(run.reorg("submit", job_type,
                                           *submit_arguments(job_type, f"{tag}_{attempt}"),
                                           "--json", times=lap))["id"]
                run.reorg("wait", str(job))
            run.reorg("status", str(job), "--json",
                      times=times.setdefault("`reorg status JOB --json`", Times()))
            run.reorg("status", str(job), times=times.setdefault("`reorg status JOB`", Times()))
            run.timed([sys.executable, "-c", "pass"],
                      times.setdefault("`python -c pass` (any Python process)", Times()))
    times.setdefault("load average (1 min) after", Times()).wall.append(os.getloadavg()[0])


def prepare(url: str, checkout: Path) -> None:
    Run(checkout, url).reorg("db", "upgrade")
    execute(url, "CREATE SCHEMA IF NOT EXISTS bench",
            f"DROP TABLE IF EXISTS {SMALL}, {TWIN}",
            f"CREATE TABLE {SMALL} (id bigint PRIMARY KEY, a int, b text, c text)",
            f"INSERT INTO {SMALL} SELECT g, g % 97, 'item ' || g FROM generate_series(1, 10000) g",
            f"CREATE TABLE {TWIN} AS SELECT * FROM {SMALL}",
            f"ALTER TABLE {TWIN} ADD PRIMARY KEY (id)",
            f"ANALYZE {SMALL}", f"ANALYZE {TWIN}")


def report(results: dict[str, dict[str, Times]]) -> list[str]:
    labels = list(results)
    measures = list(dict.fromkeys(m for r in results.values() for m in r))
    lines = ["| measure | " + " | ".join(labels) + " |",
             "| --- | " + " | ".join("---:" for _ in labels) + " |"]
    for m in measures:
        cells = []
        for label in labels:
            t = results[label].get(m, Times())
            cells.append(", ".join(f"{x:.1f}" for x in t.wall) if m.startswith("load")
                         else t.cell())
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_times", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path,
                        help="a checkout to compare against (e.g. a git worktree of main)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of submits per phase")
    parser.add_argument("--phases", type=int, default=2,
                        help="phases per checkout, alternating (a phase is one worker's life): "
                             "a machine whose load drifts favours neither")
    parser.add_argument("--db", help="postgresql:// URL of an empty database (default: throwaway)")
    add_fast_server(parser)
    args = parser.parse_args(argv)
    checkouts = {"this checkout": REPO}
    if args.baseline:
        checkouts = {"baseline": args.baseline.resolve(), **checkouts}
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-cli-times-"))
    results: dict[str, dict[str, Times]] = {}
    for checkout in checkouts.values():
        # Byte-compiled as an installed package is: a checkout run with
        # PYTHONDONTWRITEBYTECODE set would otherwise compile its modules in
        # every command (pyc files are read even then).
        subprocess.run([sys.executable, "-m", "compileall", "-q", "framework", "backfill", "cli",
                        "migrations"], cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    with database(args.db, durable=not args.fast_server) as server:
        prepare(server.url, REPO)
        for phase in range(args.phases):
            for index, (label, checkout) in enumerate(checkouts.items()):
                measure(Run(checkout, server.url), f"v{index}p{phase}", args.repeats, log_dir,
                        results.setdefault(label, {}))
            print("\n".join(report(results)), flush=True)
    print(f"\n{os.cpu_count()} CPUs; worker logs in {log_dir}\n")
    print("\n".join(report(results)))


if __name__ == "__main__":
    main()
