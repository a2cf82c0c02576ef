"""How long each read-only ``reorg`` command takes as a process, against the
least any process that reads the database takes, and what each command
imports (issue 25, target 6: ``reorg status JOB`` ≤ 250 ms on an idle
machine, ≤ 1.3x the floor under load).

    python -m bench.command_latency [--rounds 7] [--import-runs 5] [--baseline PATH]
                                    [--load-rows 500000] [--load-subtasks 100000] [--no-load]
                                    [--only 'status JOB']

On a throwaway durable local PostgreSQL (fsync and synchronous_commit on; or
``--db``): ``reorg db upgrade``, a finished ``sql-update`` job and a finished
``checksum`` job on a 10,000-row table (run by one ``reorg worker``, stopped
before anything is timed). Then:

- **imports**: each command (the read-only ones below, and ``submit
  --dry-run``, a refused ``cancel`` and ``db current`` for comparison) run
  ``--import-runs`` times with ``python -X importtime``; the median of each
  module's own time, summed, and by package: a module's time goes to the
  nearest package on its import chain that is not the standard library's
  (``typer`` for the ``inspect`` typer imports); how many modules it loads
  (steady where times are not); the heavy packages it loads (SQLAlchemy,
  rich, alembic, APScheduler, pyspark, the worker's node...);
- **idle**: no worker running, ``--rounds`` rounds; in each, every command
  once, each beside a run of the floor at the same moment (their order
  alternating by round): a Python process that only connects with psycopg
  and runs ``SELECT 1``; and ``python -c pass``;
- **under load** (unless ``--no-load``): the same while ``reorg submit
  sql-update --set c=md5(b)`` of ``--load-rows`` rows in ``--load-subtasks``
  subtasks runs on 2 ``reorg worker`` processes x 2 slots (issue 25's
  100,000-subtask job; submitted again if it ends before the rounds do).
  ``status JOB`` and ``events JOB`` then read the running job.

Each command runs as a user runs it: the ``reorg`` script beside this Python
(or ``python -m cli.main``), this checkout's code first on the path
(byte-compiled first, as an installed package is). Wall time, and the CPU
time the process used (user + system: steadier on a shared machine); medians.
The ratios are medians over the rounds of command / floor at the same
moment, of wall and of CPU time. ``--baseline PATH``: another checkout's
commands (e.g. main's) take their turn in each round too, each against the
same floor run, and get import profiles of their own (its system tables must
be at this checkout's migration head). Printed as markdown, not written: copy what matters into
docs/benchmarks.md.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.bigtable.measure import wait_for
from bench.cancel_scale import workers
from bench.dataplane.errors import BenchError
from bench.dataplane.reorg_cli import REPO, clean_env
from bench.dataplane.server import add_fast_server, build_table, database, execute
from bench.dataplane.tracking import job_status, system_tables
from framework import control
from framework.db import Database
from framework.states import JOB_TERMINAL

SMALL, TWIN = "bench.small", "bench.small_twin"
LOAD_TABLE = "bench.items"
FLOOR = "import sys, psycopg; psycopg.connect(sys.argv[1]).execute('SELECT 1').fetchall()"
# The ``reorg`` script as a user's environment runs it (not a version
# manager's shim in front of it).
SCRIPT = Path(sys.executable).with_name("reorg")
STATUS_TARGET_IDLE_MS, STATUS_TARGET_RATIO = 250, 1.3
# Packages a short read command should not need, reported when loaded.
HEAVY = ("sqlalchemy", "alembic", "apscheduler", "pyspark", "framework.node", "rich",
         "importlib.metadata", "pglast", "starlette", "prometheus_client")


@dataclass(frozen=True)
class Command:
    """A ``reorg`` command line; JOB, DONE and CHECKSUM stand for job ids."""

    label: str
    args: tuple[str, ...]
    exit_codes: frozenset[int] = frozenset({0})
    timed: bool = True  # False: its imports are reported, its time is not

    def argv(self, jobs: dict[str, int]) -> list[str]:
        return [str(jobs.get(a, a)) for a in self.args]


COMMANDS = (
    Command("reorg --version", ("--version",)),
    Command("reorg status", ("status",)),
    Command("reorg status JOB", ("status", "JOB")),
    Command("reorg status JOB --json", ("status", "JOB", "--json")),
    Command("reorg wait JOB (ended)", ("wait", "DONE")),
    Command("reorg events JOB", ("events", "JOB")),
    Command("reorg nodes", ("nodes",)),
    Command("reorg history --job JOB", ("history", "--job", "DONE", "--limit", "20")),
    Command("reorg checksum-report JOB", ("checksum-report", "CHECKSUM")),
    Command("reorg submit sql-update --dry-run",
            ("submit", "sql-update", "--table", SMALL, "--set", "c=md5(b)", "--dry-run"),
            timed=False),
    Command("reorg cancel JOB (refused: ended)", ("cancel", "DONE"), frozenset({2}), timed=False),
    Command("reorg db current", ("db", "current"), timed=False),
)


def reorg_argv(url: str, *args: str, python_flags: tuple[str, ...] = ()) -> list[str]:
    entry = [str(SCRIPT)] if SCRIPT.exists() else ["-m", "cli.main"]
    return [sys.executable, *python_flags, *entry, "--db", url, *args]


def floor_argv(url: str, python_flags: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, *python_flags, "-c", FLOOR, url]


def env(checkout: Path = REPO) -> dict[str, str]:
    # The checkout's code first on the path: the script's `import cli.main`
    # and everything it imports come from there, not from the installed tree.
    return clean_env(PYTHONPATH=str(checkout))


def run(argv: list[str], exit_codes: frozenset[int] = frozenset({0}),
        checkout: Path = REPO) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stderr) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, cwd=checkout, env=env(checkout), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in exit_codes:
        raise BenchError(f"`{' '.join(argv[1:])}` exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()[-1500:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stderr


# -- imports ------------------------------------------------------------------


@dataclass
class ImportProfile:
    """Median own time of each module over runs, and each module's importer."""

    own_us: dict[str, float]
    parent: dict[str, str]

    @property
    def total_ms(self) -> float:
        return sum(self.own_us.values()) / 1000

    def owner(self, module: str) -> str:
        """The nearest package on the module's import chain (itself first)
        that is not the standard library's; the chain's root if none is."""
        chain = [module]
        while chain[-1] in self.parent:
            chain.append(self.parent[chain[-1]])
        for name in chain:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names:
                return top
        return f"{chain[-1].split('.')[0]} (standard library)"

    def by_package(self) -> list[tuple[str, float]]:
        totals: dict[str, float] = defaultdict(float)
        for module, us in self.own_us.items():
            totals[self.owner(module)] += us / 1000
        return sorted(totals.items(), key=lambda kv: -kv[1])

    def heavy(self) -> list[str]:
        return [h for h in HEAVY if h in self.own_us
                or any(m.startswith(h + ".") for m in self.own_us)]


def parse_importtime(stderr: str) -> tuple[dict[str, int], dict[str, str]]:
    """``-X importtime``'s lines: (own microseconds, importer) of each module.
    A module's line follows those of the modules it imported, indented one
    level deeper."""
    own: dict[str, int] = {}
    parent: dict[str, str] = {}
    waiting: dict[int, list[str]] = defaultdict(list)  # depth -> modules whose importer is next
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own_us, _, named = line[len("import time:"):].split("|")
        depth = (len(named) - len(named.lstrip()) - 1) // 2
        name = named.strip()
        own[name] = int(own_us)
        for child in waiting.pop(depth + 1, []):
            parent[child] = name
        waiting[depth].append(name)
    return own, parent


def import_profile(argv: list[str], runs: int, exit_codes: frozenset[int],
                   checkout: Path = REPO) -> ImportProfile:
    samples: dict[str, list[int]] = defaultdict(list)
    parent: dict[str, str] = {}
    for _ in range(runs):
        own, parents = parse_importtime(run(argv, exit_codes, checkout)[2])
        for module, us in own.items():
            samples[module].append(us)
        parent.update(parents)
    # A module loaded in fewer than half the runs is not part of the command.
    return ImportProfile({m: statistics.median(v) for m, v in samples.items()
                          if len(v) * 2 >= runs}, parent)


# -- times --------------------------------------------------------------------


@dataclass
class Times:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)  # the floor's wall time beside each
    floor_cpu: list[float] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [w / f for w, f in zip(self.wall, self.floor, strict=True)]

    def cpu_ratios(self) -> list[float]:
        return [c / f for c, f in zip(self.cpu, self.floor_cpu, strict=True)]


def rounds(url: str, count: int, commands: list[Command], jobs: Callable[[], dict[str, int]],
           checkouts: dict[str, Path], times: dict[str, Times], plain: Times) -> None:
    """``count`` rounds: every timed command of each checkout beside a floor
    run (the order turning by round), and ``python -c pass``. ``times`` is
    keyed by command label, then `` (LABEL)`` for a checkout but the first."""
    for r in range(count):
        for command in commands:
            if not command.timed:
                continue
            argv = reorg_argv(url, *command.argv(jobs()))
            runs: list[tuple[str, Path | None]] = [("floor", None), *(
                (command.label + ("" if i == 0 else f" ({name})"), path)
                for i, (name, path) in enumerate(checkouts.items()))]
            shift = r % len(runs)
            floor_wall = floor_cpu = 0.0
            measured = []
            for label, path in runs[shift:] + runs[:shift]:
                if path is None:
                    floor_wall, floor_cpu, _ = run(floor_argv(url))
                else:
                    measured.append((label, run(argv, command.exit_codes, path)))
            for label, (wall, cpu, _) in measured:
                t = times.setdefault(label, Times())
                t.wall.append(wall)
                t.cpu.append(cpu)
                t.floor.append(floor_wall)
                t.floor_cpu.append(floor_cpu)
        wall, cpu, _ = run([sys.executable, "-c", "pass"])
        plain.wall.append(wall)
        plain.cpu.append(cpu)
        print(f"  round {r + 1}/{count} (load average {os.getloadavg()[0]:.1f})",
              file=sys.stderr, flush=True)


# -- the jobs -----------------------------------------------------------------


def prepare(url: str, db: Database, log_dir: Path) -> dict[str, int]:
    """The finished jobs the commands read: an ``sql-update`` (DONE) and a
    ``checksum`` (CHECKSUM) on ``SMALL``, run by one worker stopped after."""
    execute(url, "CREATE SCHEMA IF NOT EXISTS bench", f"DROP TABLE IF EXISTS {SMALL}, {TWIN}",
            f"CREATE TABLE {SMALL} (id bigint PRIMARY KEY, a int, b text, c text)",
            f"INSERT INTO {SMALL} SELECT g, g % 97, 'item ' || g, NULL "
            f"FROM generate_series(1, 10000) g",
            f"CREATE TABLE {TWIN} AS TABLE {SMALL}", f"ALTER TABLE {TWIN} ADD PRIMARY KEY (id)",
            f"ANALYZE {SMALL}", f"ANALYZE {TWIN}")
    with workers(url, db, 1, 2, log_dir, name="latency-prepare"):
        done = submit(url, "sql-update", "--table", SMALL, "--set", "c=md5(b)")
        wait_ended(db, done, 300)
        execute(url, f"UPDATE {TWIN} SET c = md5(b)")
        checksum = submit(url, "checksum", "--table", SMALL, "--target", TWIN)
        wait_ended(db, checksum, 300)
    return {"DONE": done, "JOB": done, "CHECKSUM": checksum}


def submit(url: str, job_type: str, *args: str) -> int:
    done = subprocess.run(reorg_argv(url, "submit", job_type, *args, "--json"), cwd=REPO,
                          env=env(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"`reorg submit {job_type}` exited {done.returncode}: {done.stderr}")
    return int(json.loads(done.stdout)["id"])


def wait_ended(db: Database, job_id: int, timeout: float) -> None:
    def ended() -> bool:
        job = job_status(db, job_id)
        if job["state"] in JOB_TERMINAL and job["state"] != "succeeded":
            raise BenchError(f"job {job_id} {job['state']}: {job['error']}")
        return bool(job["state"] == "succeeded")
    wait_for(f"job {job_id} to succeed", ended, timeout)


class LoadJob:
    """``sql-update --set c=md5(b)`` of ``LOAD_TABLE`` in ``subtasks``
    subtasks, kept running: submitted again whenever it has ended."""

    def __init__(self, url: str, db: Database, rows: int, subtasks: int) -> None:
        self.url, self.db = url, db
        self.rows_per_subtask = max(rows // subtasks, 1)
        self.job_id: int | None = None
        self.submitted = 0

    def running(self) -> int:
        if self.job_id is None or job_status(self.db, self.job_id)["state"] in JOB_TERMINAL:
            self.job_id = submit(self.url, "sql-update", "--table", LOAD_TABLE, "--set",
                                 "c=md5(b)", "--rows-per-subtask", str(self.rows_per_subtask))
            self.submitted += 1
            job_id = self.job_id
            wait_for(f"load job {job_id} running",
                     lambda: job_status(self.db, job_id)["state"] == "running", 600)
        return self.job_id


@contextmanager
def load(url: str, db: Database, args: argparse.Namespace, log_dir: Path) -> Iterator[LoadJob]:
    print(f"building {LOAD_TABLE} with {args.load_rows:,} rows", file=sys.stderr, flush=True)
    build_table(url, args.load_rows)
    execute(url, f"VACUUM (ANALYZE) {LOAD_TABLE}")
    with workers(url, db, 2, 2, log_dir, name="latency-load"):
        job = LoadJob(url, db, args.load_rows, args.load_subtasks)
        job.running()
        yield job
        # A --db is left without a job running on (one ended meanwhile is left as it is).
        if job.job_id is not None and job_status(db, job.job_id)["state"] not in JOB_TERMINAL:
            control.cancel(db, job.job_id)


# -- the report ---------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def times_table(times: dict[str, Times], plain: Times, loaded: bool) -> list[str]:
    lines = ["| command | wall, median | floor beside it | wall / floor, median (min-max) "
             "| CPU, median (floor's) | CPU / floor's | target |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for label, t in times.items():
        ratios = t.ratios()
        target = ""
        if label.startswith("reorg status JOB") and not label.startswith("reorg status JOB --"):
            target = (f"≤ {STATUS_TARGET_RATIO}x the floor" if loaded
                      else f"≤ {STATUS_TARGET_IDLE_MS} ms")
            met = (statistics.median(ratios) <= STATUS_TARGET_RATIO if loaded
                   else statistics.median(t.wall) * 1000 <= STATUS_TARGET_IDLE_MS)
            target += ": met" if met else ": not met"
        lines.append(f"| `{label}` | {ms(statistics.median(t.wall))} | "
                     f"{ms(statistics.median(t.floor))} | {statistics.median(ratios):.2f}x "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) | {ms(statistics.median(t.cpu))} "
                     f"({ms(statistics.median(t.floor_cpu))}) | "
                     f"{statistics.median(t.cpu_ratios()):.2f}x | {target} |")
    lines.append(f"| `python -c pass` | {ms(statistics.median(plain.wall))} | | | "
                 f"{ms(statistics.median(plain.cpu))} | | |")
    return lines


def imports_table(profiles: dict[str, ImportProfile], top: int) -> list[str]:
    lines = ["| command | modules | imports, total | by package (top) | of note, loaded |",
             "| --- | ---: | ---: | --- | --- |"]
    for label, p in profiles.items():
        packages = ", ".join(f"{name} {value:.0f}" for name, value in p.by_package()[:top])
        lines.append(f"| `{label}` | {len(p.own_us)} | {p.total_ms:.0f} ms | {packages} | "
                     f"{', '.join(p.heavy()) or '-'} |")
    return lines


def measure(url: str, args: argparse.Namespace, log_dir: Path) -> list[str]:
    commands = [c for c in COMMANDS if not args.only or any(o in c.label for o in args.only)]
    checkouts = {"this checkout": REPO}
    if args.baseline:
        checkouts["baseline"] = args.baseline.resolve()
    for checkout in checkouts.values():
        # Byte-compiled as an installed package is (PYTHONDONTWRITEBYTECODE
        # would otherwise have every run compile its modules).
        subprocess.run([sys.executable, "-m", "compileall", "-q", "framework", "backfill", "cli",
                        "migrations"], cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(reorg_argv(url, "db", "upgrade"), cwd=REPO, env=env(), check=True,
                   capture_output=True)
    with system_tables(url) as db:
        jobs = prepare(url, db, log_dir)
        print("import profiles", file=sys.stderr, flush=True)
        flags = ("-X", "importtime")
        profiles = {"floor: connect + SELECT 1": import_profile(
            floor_argv(url, flags), args.import_runs, frozenset({0}))}
        for i, (name, checkout) in enumerate(checkouts.items()):
            for command in commands:
                profiles[command.label + ("" if i == 0 else f" ({name})")] = import_profile(
                    reorg_argv(url, *command.argv(jobs), python_flags=flags), args.import_runs,
                    command.exit_codes, checkout)
        print("idle", file=sys.stderr, flush=True)
        idle: dict[str, Times] = {}
        idle_plain = Times()
        load_before = os.getloadavg()[0]
        rounds(url, args.rounds, commands, lambda: jobs, checkouts, idle, idle_plain)
        baseline = (f"; baseline: {git_head(checkouts['baseline'])} at {args.baseline}"
                    if args.baseline else "")
        report = [
            f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {git_head(REPO)}{baseline}, "
            f"{os.cpu_count()} CPUs, "
            f"`{' '.join(['python -m bench.command_latency', *sys.argv[1:]])}`; entry: "
            f"{'the `reorg` script' if SCRIPT.exists() else 'python -m cli.main'}",
            "", f"Imports (`python -X importtime`, median of {args.import_runs} runs; ms):", "",
            *imports_table(profiles, args.top), "",
            f"Idle (no worker running; load average {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after), {args.rounds} rounds:", "",
            *times_table(idle, idle_plain, loaded=False)]
        if not args.no_load:
            with load(url, db, args, log_dir) as job:
                print("under load", file=sys.stderr, flush=True)
                loaded: dict[str, Times] = {}
                loaded_plain = Times()
                load_before = os.getloadavg()[0]
                rounds(url, args.rounds, commands, lambda: {**jobs, "JOB": job.running()},
                       checkouts, loaded, loaded_plain)
                report += [
                    "", f"Under load: `sql-update --set c=md5(b)` of {args.load_rows:,} rows in "
                    f"{args.load_subtasks:,} subtasks on 2 workers x 2 slots, running throughout "
                    f"({job.submitted} job(s)); load average {load_before:.1f} before, "
                    f"{os.getloadavg()[0]:.1f} after; {args.rounds} rounds:", "",
                    *times_table(loaded, loaded_plain, loaded=True)]
    return report


def git_head(checkout: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout,
                          capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=checkout,
                           capture_output=True, text=True, check=False).stdout.strip()
    return (done.stdout.strip() or "unknown commit") + (" (with changes)" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.command_latency",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="postgresql:// URL of a scratch database "
                                     "(default: a throwaway durable local cluster)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of every command, per phase")
    parser.add_argument("--import-runs", type=int, default=5,
                        help="`-X importtime` runs of each command")
    parser.add_argument("--top", type=int, default=6, help="packages listed per command")
    parser.add_argument("--load-rows", type=int, default=500_000)
    parser.add_argument("--load-subtasks", type=int, default=100_000)
    parser.add_argument("--no-load", action="store_true", help="the idle figures only")
    parser.add_argument("--only", action="append", metavar="TEXT",
                        help="only the commands whose label holds TEXT (repeat for more), "
                             "e.g. --only 'status JOB'")
    parser.add_argument("--baseline", type=Path,
                        help="a checkout whose commands take turns with this one's "
                             "(e.g. `git worktree add --detach /tmp/base main`)")
    add_fast_server(parser)
    args = parser.parse_args()
    if not 1 <= args.load_subtasks <= args.load_rows:
        parser.error("--load-subtasks must be between 1 and --load-rows")
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-latency-logs-"))
    try:
        with database(args.db, durable=not args.fast_server) as server:
            report = measure(server.url, args, log_dir)
    except BenchError as exc:
        sys.exit(f"error: {exc} (worker logs in {log_dir})")
    print("\n".join(report))


if __name__ == "__main__":
    main()
