"""Where a machine's CPU went over a time window, by who used it: the
server's backends grouped by ``application_name`` (reorg's worker slots, its
owner, a baseline's plain connections), the server's own processes
(checkpointer, WAL writer, autovacuum...), the processes of given trees (a
``reorg worker``), everything else, and idle. A process that ends inside
the window is counted through the process that waited for it: a backend
through the postmaster (ENDED_BACKENDS), a tree's child in its tree.

On a 2-core machine where the server's backends want both cores, every
CPU-second a client spends is one the server does not get: a contender's
rows/s over a window follows from this split, so the benchmark that
compares two contenders prints it beside their rates.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.dataplane.errors import BenchError
from bench.dataplane.proctree import process_tree, processes, stat_fields

HZ = os.sysconf("SC_CLK_TCK")
SERVER_PROCESSES = "server's own processes"  # checkpointer, walwriter, autovacuum...
OTHER = "other processes"
# Backends (a baseline's own connections) that ended inside the window: the
# postmaster's reaped CPU, less what those alive at the start had used by then.
ENDED_BACKENDS = "backends that ended in the window"


def _idle_ticks() -> int:
    """Idle + iowait clock ticks of all CPUs since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return int(fields[3]) + int(fields[4])


def _backend_groups(url: str) -> tuple[dict[int, str], int]:
    """Server pids by group: a client backend by its ``application_name``
    with its numbers as ``N`` (``reorg-job-N-subtask-N-epoch-N``), or
    ``client backend``; any other server process as SERVER_PROCESSES. And
    the postmaster's pid: the parent of this session's backend, read while
    that backend is still there (0 where /proc does not show it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, backend_type, application_name FROM pg_stat_activity").fetchall()
        (own,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        fields = stat_fields(int(own))
    postmaster = int(fields[1]) if fields is not None else 0
    groups = {}
    for pid, backend_type, app in rows:
        if backend_type == "client backend":
            groups[int(pid)] = re.sub(r"\d+", "N", app or "") or "client backend"
        else:
            groups[int(pid)] = SERVER_PROCESSES
    return groups, postmaster


@dataclass
class Snapshot:
    ticks: dict[int, int]  # pid -> utime + stime
    idle: int
    groups: dict[int, str]  # pid -> group, for the pids it can tell
    reaped: dict[int, int]  # pid -> CPU ticks of its children that ended (cutime + cstime)
    parents: dict[int, int]  # pid -> ppid
    postmaster: int


class WindowCpu:
    """``start()``, then ``stop()`` returns CPU seconds by group over the
    window. ``trees``: named process trees (name -> root pid) counted as one
    group each. The server's processes are told apart by ``url``'s
    ``pg_stat_activity`` read at both ends; a backend that ends inside the
    window is counted under ENDED_BACKENDS."""

    def __init__(self, url: str, trees: dict[str, int]) -> None:
        self.url, self.trees = url, trees
        self._start: Snapshot | None = None

    def _snapshot(self) -> Snapshot:
        groups, postmaster = _backend_groups(self.url)
        table = processes()
        for name, root in self.trees.items():
            for pid in process_tree(root, table):
                groups.setdefault(pid, name)
        groups.setdefault(postmaster, SERVER_PROCESSES)
        return Snapshot({pid: p.cpu_ticks for pid, p in table.items()}, _idle_ticks(), groups,
                        {pid: p.reaped_ticks for pid, p in table.items()},
                        {pid: p.ppid for pid, p in table.items()}, postmaster)

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self, ended: Iterable[int] = (), timeout: float = 30.0) -> dict[str, float]:
        """``ended``: pids of backends that end as the window ends (a
        baseline's connections, just closed), waited for until their parent
        has reaped them: a process exiting while the last snapshot is read
        would be counted nowhere."""
        assert self._start is not None, "start() first"
        _wait_gone(ended, timeout)
        first, last = self._start, self._snapshot()
        groups = {**last.groups, **first.groups}
        # What the children that ended inside the window had used before it
        # began, by parent: not part of the parent's reaped CPU of the window.
        before: dict[int, int] = {}
        for child, parent in first.parents.items():
            if child not in last.ticks:
                before[parent] = before.get(parent, 0) + first.ticks[child]
        used: dict[str, float] = {}
        for pid, ticks in last.ticks.items():
            name = groups.get(pid, OTHER)
            # Its own CPU, and that of its children that ended in the window.
            spent = ticks - first.ticks.get(pid, 0)
            reaped = last.reaped[pid] - first.reaped.get(pid, 0) - before.get(pid, 0)
            if pid == last.postmaster:
                used[ENDED_BACKENDS] = used.get(ENDED_BACKENDS, 0.0) + max(reaped, 0) / HZ
            else:
                spent += reaped
            if spent > 0:
                used[name] = used.get(name, 0.0) + spent / HZ
        used["idle"] = (last.idle - first.idle) / HZ
        return dict(sorted(used.items(), key=lambda kv: -kv[1]))


def _wait_gone(pids: Iterable[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while os.path.exists(f"/proc/{pid}"):
            if time.monotonic() > deadline:
                raise BenchError(f"process {pid} still there {timeout:.0f} s after it ended")
            time.sleep(0.01)


def describe(used: dict[str, float], seconds: float) -> str:
    """``group 1.23, ...``: each group's CPU in cores (CPU seconds per second
    of a window of ``seconds``), groups under 0.005 CPU-s left out."""
    return ", ".join(f"{name} {cpu / seconds:.2f}" for name, cpu in used.items() if cpu >= 0.005)
