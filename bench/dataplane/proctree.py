"""Processes, from /proc: a process tree, its resident memory, when its
processes started, and the CPU time used by everything outside the benchmark."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SAMPLE_SECONDS = 0.2  # memory sampling period


@dataclass(frozen=True)
class Proc:
    ppid: int
    cpu_ticks: int  # utime + stime
    start_ticks: int  # start time, clock ticks after boot
    reaped_ticks: int = 0  # cutime + cstime: of its children that ended and it waited for


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (``fields[0]`` is field
    3 of proc(5): ppid 4, utime 14, stime 15, cutime 16, cstime 17, starttime
    22); None once the process has exited."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):  # exited, or exiting as it was read
        return None


def processes() -> dict[int, Proc]:
    """Every process, from /proc/PID/stat."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(int(entry))) is not None:
            table[int(entry)] = Proc(int(fields[1]), int(fields[11]) + int(fields[12]),
                                     int(fields[19]), int(fields[13]) + int(fields[14]))
    return table


def process_tree(root: int, table: dict[int, Proc] | None = None) -> list[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for pid, proc in (table if table is not None else processes()).items():
        children.setdefault(proc.ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def launch_times(root: int, comm: str) -> list[float]:
    """When the processes named ``comm`` (``java``) in ``root``'s tree started,
    in epoch seconds to a clock tick, oldest first."""
    table = processes()
    # Boot time from uptime: /proc/stat's btime is whole seconds.
    booted = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    hz = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in process_tree(root, table):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue  # exited meanwhile
        if name == comm and pid in table:
            out.append(booted + table[pid].start_ticks / hz)
    return sorted(out)


def tree_cpu_ticks(roots: list[int]) -> int:
    """CPU clock ticks used so far by the process trees of ``roots``: each
    live process's own (utime + stime) plus what its reaped children used
    (cutime + cstime). The difference of two readings is what the trees used
    in between, processes started, ended or both meanwhile included: a child
    reaped in between moves its ticks into its parent's cutime."""
    table = processes()
    total = 0
    for pid in {pid for root in roots for pid in process_tree(root, table)}:
        fields = stat_fields(pid)
        if fields is None:
            continue  # exited meanwhile: its parent's cutime has it at the next reading
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total


class OtherCpu(threading.Thread):
    """CPU seconds used by processes outside the benchmark's own trees (this
    process with its workers and Spark, and our PostgreSQL server): other
    people's work on the machine skews every timing, so it is reported.
    Sampled every second; a process that starts and ends between two samples
    is missed."""

    def __init__(self, roots: list[int]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.ticks = 0
        self._seen: dict[int, int] = {}
        self._hz = os.sysconf("SC_CLK_TCK")
        self._began = int(float(Path("/proc/uptime").read_text().split()[0]) * self._hz)
        self._stop_event = threading.Event()
        self._sample()

    def _sample(self) -> None:
        table = processes()
        ours = {pid for root in self.roots for pid in process_tree(root, table)}
        for pid, proc in table.items():
            # A process started since we began counts from zero; ours are tracked
            # too, so a JVM that outlives its parent (and is re-parented to init)
            # does not bring its whole CPU time along.
            before = self._seen.get(pid, 0 if proc.start_ticks > self._began else proc.cpu_ticks)
            if pid not in ours:
                self.ticks += max(proc.cpu_ticks - before, 0)
            self._seen[pid] = proc.cpu_ticks

    def run(self) -> None:
        while not self._stop_event.wait(1.0):
            self._sample()

    def seconds(self) -> float:
        return self.ticks / self._hz

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def rss_by_process(root: int) -> dict[str, int]:
    """Resident bytes of each process in the tree, keyed ``comm:pid``."""
    page = os.sysconf("SC_PAGE_SIZE")
    sizes: dict[str, int] = {}
    for pid in process_tree(root):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        sizes[f"{comm}:{pid}"] = resident
    return sizes


class RssSampler(threading.Thread):
    """Samples the RSS of a process tree every SAMPLE_SECONDS until stopped."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_SECONDS):
            self.samples.append((time.time(), rss_by_process(self.root)))

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()

    def peak(self, since: float = 0.0, until: float = float("inf")) -> tuple[int, dict[str, int]]:
        """The largest tree total in [since, until] and its per-process split."""
        window = [s for t, s in self.samples if since <= t <= until] or [{}]
        top = max(window, key=lambda s: sum(s.values()))
        return sum(top.values()), top


@dataclass
class Reading:
    """What other processes did while one contender ran."""

    cpu_seconds: float | None = None  # their CPU time; None: not measured
    wall_seconds: float = 0.0
    disturbed: bool = False  # they took more than Neighbours.DISTURBED of the machine


class Neighbours:
    """The other processes on the machine: before a contender, wait (up to
    ``quiet_limit`` seconds) until they leave the CPUs alone; during it,
    measure how much CPU they took. Inactive (no waiting, nothing measured)
    when ``roots`` is empty, e.g. when the database server is not ours."""

    WINDOW = 3.0  # seconds watched before calling the machine quiet
    QUIET = 0.1  # ... if others used less than this share of one CPU meanwhile
    DISTURBED = 0.1  # share of all CPUs' time others may take during a contender

    def __init__(self, roots: list[int], quiet_limit: float) -> None:
        self.cpu = OtherCpu(roots) if roots else None
        self.quiet_limit = quiet_limit
        if self.cpu:
            self.cpu.start()

    def settle(self) -> None:
        if self.cpu is None or self.quiet_limit <= 0:
            return
        deadline = time.monotonic() + self.quiet_limit
        while True:
            before = self.cpu.seconds()
            time.sleep(self.WINDOW)
            share = (self.cpu.seconds() - before) / self.WINDOW
            if share <= self.QUIET:
                return
            if time.monotonic() >= deadline:
                print(f"    other processes still use {share:.0%} of a CPU; measuring anyway",
                      flush=True)
                return
            print(f"    waiting: other processes use {share:.0%} of a CPU", flush=True)

    @contextlib.contextmanager
    def measured(self) -> Iterator[Reading]:
        reading = Reading()
        before = self.cpu.seconds() if self.cpu else 0.0
        began = time.monotonic()
        yield reading
        reading.wall_seconds = time.monotonic() - began
        if self.cpu:
            reading.cpu_seconds = self.cpu.seconds() - before
            capacity = (os.cpu_count() or 1) * reading.wall_seconds
            reading.disturbed = reading.cpu_seconds > self.DISTURBED * capacity

    def stop(self) -> None:
        if self.cpu:
            self.cpu.stop()
