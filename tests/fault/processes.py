"""Real ``reorg worker`` processes for fault tests: started with short leases
and optional fault points, their logs kept, and always killed at teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

LEASE_SECONDS = "3"


@dataclass
class WorkerProcess:
    node_id: str
    proc: subprocess.Popen
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
    started: list[WorkerProcess] = field(default_factory=list)

    def start(self, node_id: str, *, slots: int = 2, faults: str = "",
              prefix: Callable[[list[str]], list[str]] = lambda argv: argv,
              **env: str) -> WorkerProcess:
        log_path = Path(tempfile.mkstemp(prefix=f"reorg-{node_id}-", suffix=".log")[1])
        environment = {
            **os.environ,
            "REORG_DATABASE_URL": self.url,
            "REORG_LEASE_SECONDS": LEASE_SECONDS,
            "REORG_OWNER_LEASE_SECONDS": LEASE_SECONDS,
            "REORG_NODE_ID": node_id,
            "REORG_SLOTS": str(slots),
            "REORG_FAULTS": faults,
            **env,
        }
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(prefix([sys.executable, "-m", "cli.main", "worker"]),
                                    env=environment, cwd=Path(__file__).parents[2],
                                    stdout=log, stderr=subprocess.STDOUT)
        worker = WorkerProcess(node_id, proc, log_path)
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
