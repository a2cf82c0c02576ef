"""The ``reorg`` command run as a subprocess, as a user runs it: submit, wait,
list nodes; and the Spark class-data archive built before anything is timed."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.dataplane.errors import BenchError
from bench.dataplane.records import TABLE
from bench.dataplane.timing import timed

REPO = Path(__file__).resolve().parents[2]


# The REORG_* variables passed on: whether and where reorg's JVMs keep their
# class-data archive (the report says which), and the system tables' schema
# (``sql_update_ab`` gives a baseline checkout its own).
PASSED_ON = {"REORG_SPARK_CDS", "REORG_SCHEMA"}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without REORG_* knobs (a stray REORG_BATCH_ROWS would
    change what is measured) but for PASSED_ON, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REORG_") or k in PASSED_ON}
    return env | extra


def command(url: str, *args: str) -> list[str]:
    """``reorg --db URL ARGS`` as ``REPO``'s sources run it (``cwd=REPO``)."""
    return [sys.executable, "-m", "cli.main", "--db", url, *args]


def reorg(url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command(url, *args), cwd=REPO, capture_output=True, text=True,
                          env=clean_env())
    if check and done.returncode != 0:
        raise BenchError(f"`reorg {' '.join(args)}` exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done


SET_C = ("--set", "c=md5(b)")
ADD_D = ("--set", "d=md5(b)", "--add-column", "d:text")


def submit(url: str, job_type: str, args: tuple[str, ...] = SET_C) -> tuple[int, float]:
    """`reorg submit JOB_TYPE --table bench.items ARGS` (default `--set
    c=md5(b)`): the job id and how long the command took."""
    with timed(f"reorg submit {job_type}") as lap:
        done = reorg(url, "submit", job_type, "--table", TABLE, *args, "--json")
    return int(json.loads(done.stdout)["id"]), lap.seconds


class WaitingSubmit:
    """`reorg submit JOB_TYPE --table bench.items ARGS --json --wait` running:
    one command from submit to the job's end, as a user runs a job to its end
    (a second process, `reorg wait`, would start while the job's first
    batches run and take the CPU they need). ``submit_seconds``: until it
    printed the job's id, the submit's own part."""

    def __init__(self, url: str, job_type: str, args: tuple[str, ...]) -> None:
        cmd = command(url, "submit", job_type, "--table", TABLE, *args, "--json", "--wait")
        clock = time.perf_counter()
        self._proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=clean_env())
        assert self._proc.stdout is not None
        printed = ""
        while True:  # the JSON object printed before the wait (over several lines)
            line = self._proc.stdout.readline()
            if not line:
                self.wait()  # raises: it exited without submitting
            printed += line
            with contextlib.suppress(json.JSONDecodeError):
                self.job_id = int(json.loads(printed)["id"])
                break
        self.submit_seconds = time.perf_counter() - clock
        print(f"    reorg submit {job_type} --wait: job {self.job_id} after "
              f"{self.submit_seconds:.2f} s", flush=True)

    def wait(self) -> None:
        """Until the command exits; BenchError unless the job succeeded."""
        out, err = self._proc.communicate()
        if self._proc.returncode != 0:
            raise BenchError(f"`reorg submit --wait` exited {self._proc.returncode}: "
                             f"{(err or out).strip()[-2000:]}")


# What any command on reorg's stack imports before its first statement: the
# interpreter with SQLAlchemy's psycopg dialect and typer (not reorg's own
# modules, nor pglast, which only reorg's checks need).
_STACK_IMPORTS = "import sqlalchemy, sqlalchemy.dialects.postgresql.psycopg, psycopg, typer"


def stack_import_seconds(repeats: int = 3) -> float:
    """Median wall time of a Python process that only imports reorg's CLI
    stack and exits: the part of `reorg submit`'s time no change to reorg's
    own code can remove (the floor of a job's fixed cost on this stack)."""
    times = []
    for _ in range(repeats):
        clock = time.perf_counter()
        subprocess.run([sys.executable, "-c", _STACK_IMPORTS], check=True, env=clean_env())
        times.append(time.perf_counter() - clock)
    seconds = statistics.median(times)
    print(f"    a process importing reorg's CLI stack: {seconds:.2f} s (median of {repeats})",
          flush=True)
    return seconds


def wait_job(url: str, job_id: int) -> None:
    done = reorg(url, "wait", str(job_id), check=False)
    if done.returncode != 0:
        raise BenchError(f"`reorg wait {job_id}` exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()}")


# Prints the archive's path ("" when disabled) and builds it if missing.
BUILD_ARCHIVE = """
from backfill.spark import cds, session
archive = session.cds_archive()
print(archive or "")
raise SystemExit(0 if archive is None or cds.build(archive) else 1)
"""


def build_spark_archive() -> str:
    """Build the Spark class-data archive reorg's processes start from, before
    anything is timed: a worker would otherwise build it in the background
    during the first reorg run. Returns how the report should describe it."""
    done = subprocess.run([sys.executable, "-c", BUILD_ARCHIVE], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True)
    archive = done.stdout.strip()
    if not archive:
        return "off"
    if done.returncode != 0:
        print(f"warning: Spark class-data archive not built: {done.stderr.strip()[-500:]}",
              flush=True)
        return "failed to build (reorg's JVMs start without it)"
    return "on for reorg's worker and `reorg submit` JVMs (the plain Spark job has none)"
