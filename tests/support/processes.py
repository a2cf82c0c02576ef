"""Real ``reorg worker`` processes: started either as fault tests start them
(``python -m cli.main worker`` configured through ``REORG_*``, with short
leases, optional fault points and the test job types) or as a user would
(``start_cli``: the installed ``reorg`` command, options only, an environment
cleared of ``REORG_*``); their logs kept, and always killed at teardown.
Each is forked from a warm process (``support.forkserver``) where it can be:
a process of its own all the same, killed, stopped and waited on by pid."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from framework.faults import Gates
from support import forkserver


def _installed_reorg() -> str | None:
    """The ``reorg`` script of the interpreter running the tests: the one
    ``pip install -e .`` made for it, without a version manager's shim
    (pyenv's costs a bash and ~60 ms a command) in front of it."""
    beside = Path(sys.executable).with_name("reorg")
    return str(beside) if beside.is_file() else shutil.which("reorg")


REORG = _installed_reorg()
LEASE_SECONDS = "3"
TESTS = Path(__file__).parents[1]
# Worker processes load the test job type (support.fill) the way a deployment
# loads an installed one; REORG_JOB_TYPES is read by framework.jobtype.
TEST_JOB_TYPES = "support.fill:register"


# Kept by clean_env: where the tests' Spark class-data archive is (or "off"),
# so that no command a test runs builds one in $HOME (support.spark_archive),
# and the test JVMs' settings (tests/conftest.py).
KEPT = ("REORG_SPARK_CDS", "REORG_SPARK_CONF")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any ``REORG_*`` variable but ``KEPT``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REORG_") or k in KEPT}
    return {**env, "COLUMNS": "200", **extra}


@dataclass
class WorkerProcess:
    node_id: str
    proc: subprocess.Popen[bytes] | forkserver.Forked
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Workers:
    url: str
    gates: Gates | None = None  # where their ``block`` fault points wait to be released
    started: list[WorkerProcess] = field(default_factory=list)

    def start(self, node_id: str, *, slots: int = 2, faults: str = "",
              prefix: Callable[[list[str]], list[str]] = lambda argv: argv,
              **env: str) -> WorkerProcess:
        """A worker configured through the environment, as fault tests want it."""
        path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
        environment = {
            **os.environ,
            "PYTHONPATH": path,
            "REORG_DATABASE_URL": self.url,
            "REORG_LEASE_SECONDS": LEASE_SECONDS,
            "REORG_OWNER_LEASE_SECONDS": LEASE_SECONDS,
            "REORG_NODE_ID": node_id,
            "REORG_SLOTS": str(slots),
            # As the in-process nodes' settings: an idle worker finds a lease
            # that expired (no NOTIFY tells it) within 0.2 s, not 1 s.
            "REORG_POLL_SECONDS": "0.2",
            "REORG_FAULTS": faults,
            "REORG_JOB_TYPES": TEST_JOB_TYPES,
            **(self.gates.env() if self.gates else {}),
            **env,
        }
        return self._spawn(node_id, prefix([sys.executable, "-m", "cli.main", "worker"]),
                           environment)

    def start_cli(self, node_id: str, *args: str) -> WorkerProcess:
        """``reorg --db URL ... worker --node-id ID ARGS``, as a user runs it."""
        assert REORG, "the `reorg` command is not installed; run `pip install -e .`"
        argv = [REORG, "--db", self.url, "--lease-seconds", "5", "--owner-lease-seconds", "5",
                "worker", "--node-id", node_id, "--poll-seconds", "0.2", *args]
        return self._spawn(node_id, argv, clean_env())

    def _spawn(self, node_id: str, argv: list[str], env: dict[str, str]) -> WorkerProcess:
        fd, path = tempfile.mkstemp(prefix=f"reorg-{node_id}-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            forked = forkserver.start(argv, env=env, cwd=str(TESTS.parent), output=log.fileno())
            proc = forked or subprocess.Popen(argv, env=env, cwd=TESTS.parent,
                                              stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT)
        worker = WorkerProcess(node_id, proc, Path(path))
        self.started.append(worker)
        return worker

    def stop_all(self) -> None:
        for w in self.started:
            if w.alive():
                try:
                    w.signal(signal.SIGCONT)
                    w.signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
            w.proc.wait(timeout=10)
            w.log_path.unlink(missing_ok=True)

    def __iter__(self) -> Iterator[WorkerProcess]:
        return iter(self.started)


def proc_state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
