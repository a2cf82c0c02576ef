"""Named fault points and test signals (after TiDB's failpoints and river's
``testsignal``).

Production code calls ``faults.hit("worker.after_batch")`` at exact stages.
Every name it may pass is listed in ``POINTS`` (a unit test checks the list
against the calls in the code; ``arm`` refuses any other name). A point is a
no-op unless a test arms it or turns signals on.

Arming. In the test's own process ``faults.arm("worker.after_batch", "block")``;
in a process the test starts, the ``REORG_FAULTS`` environment variable, e.g.
``REORG_FAULTS="worker.before_checkpoint=stop@2,owner.after_prepare=exit"``.

Actions: ``exit`` (os._exit(137), like kill -9), ``sleep:SECONDS``, ``stop``
(SIGSTOP to itself), ``raise`` (RuntimeError), ``retryable`` (a retryable
error), ``block`` (wait at the point until released, see below). ``@N`` after
an action fires it only on the N-th hit of that point in the process.

Signals (in-process). After ``enable_signals()`` every hit of a point is
recorded, armed or not; ``wait(name, timeout)`` returns once a hit of ``name``
that no earlier ``wait`` consumed has happened (or raises AssertionError), so
a test waits for "a batch committed" instead of slowing the job down.

Blocking. A thread that hits a point armed ``block`` waits there until the
point is released; a released point stays open until ``disarm_all`` (which
also lets every blocked thread go)::

    test process                         process under test
    ------------                         ------------------
    faults.arm(...) / REORG_FAULTS       hit("worker.after_batch")
                                           ├─ marker <dir>/worker.after_batch.<pid>.<n>.blocked
    wait_blocked(...)  ◄── sees marker ────┤  (in-process: a counter and a condition)
    release(...) ── <dir>/worker.after_batch.released ──► the thread goes on,
                                                          removes its marker

In the test's own process use ``wait_blocked(name)`` / ``release(name)``.
Across processes, ``Gates(directory)`` does the same through files in the
directory the processes get as ``REORG_FAULTS_DIR`` (``Gates.env()``): a
blocked process creates one marker file per blocked thread and polls (every
20 ms) for the ``<name>.released`` file. Files, not a database lock, so a
point also blocks where the database is out of reach (a partitioned host).
"""

from __future__ import annotations

import os
import signal as _os_signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from framework.errors import RetryableError

# Every point production code hits: ``<component>.<stage>``.
POINTS: tuple[str, ...] = (
    "owner.after_analyse",        # owner: a job's input accepted (JobType.analyse), not yet split
    "owner.before_split",         # owner: job prepared, the key space not yet split
    "owner.after_split",          # owner: the split read its snapshot; prepare not yet run
    "owner.after_prepare",        # owner: prepare ran, its fenced transaction still open
    "owner.after_split_chunk",    # owner: a chunk of a big split committed (not flushed), more to go
    "owner.after_advance_step",   # owner: a step advanced, transaction still open
    "owner.after_next_step",      # owner: next step's DDL and subtasks done, transaction open
    "owner.before_cutover",       # owner: last step complete, the type's advance not yet run
    "owner.before_revert_plan",   # owner: about to plan a revert step (fenced transaction)
    "owner.after_revert_plan",    # owner: revert subtasks inserted, transaction still open
    "owner.before_rollback",      # owner: about to run the job type's final revert DDL
    "owner.after_rollback",       # owner: revert DDL ran, transaction still open
    "owner.after_history_batch",  # owner: one batch of subtasks moved to history
    "worker.after_claim",         # worker slot: subtask claimed, not yet run
    "worker.before_checkpoint",   # worker: batch written, checkpoint not yet (transaction open)
    "worker.after_checkpoint",    # worker: checkpoint written, batch not yet committed
    "worker.after_commit",        # subtask: a batch committed, its slot not yet told (finished?)
    "worker.after_batch",         # subtask: a batch and its checkpoint committed
    "worker.in_restore_batch",    # revert subtask: a restore batch ran, not yet committed
    "worker.in_restore_index",    # revert subtask: restore indexes built, not yet committed
    "subtask.stop",               # subtask: asked to stop (pause, drain, cancel, lease lost)
    "alter_type.before_verify",   # alter-type: a verify subtask about to check its first batch
    "alter_type.before_build",    # alter-type: a build-indexes subtask about to build or validate
    "alter_type.in_cutover",      # alter-type: columns swapped, the cut-over's transaction open
    "rewrite.before_build",       # rewrite: a build subtask about to make its index or constraint
    "rewrite.before_replay",      # rewrite: a catch-up subtask about to replay a round of the log
    "rewrite.before_verify",      # rewrite: a verify subtask about to check its first batch
    "rewrite.in_analyze",         # rewrite: a verify subtask ANALYZEd the shadow, not committed
    "rewrite.before_swap",        # rewrite: the owner about to lock T for the swap
    "rewrite.swap_spark_locked",  # rewrite --engine spark: T locked against writes, Spark not yet reading
    "rewrite.in_swap",            # rewrite: T swapped, the owner's transaction still open
    "throttle.held",              # health gate: a slot holds a job's next batch (unhealthy)
    "spark.before_apply",         # Spark pipeline: batch read and computed, not yet applied
    "spark.after_stage",          # Spark backfill: batch staged in PostgreSQL, merge not run
    "submit.before_insert",       # submit: the input validated, nothing written yet
    "submit.in_insert",           # submit: the job inserted, its transaction not committed
    "submit.after_insert",        # submit: the job committed, its id not yet returned
)

_POLL_SECONDS = 0.02

_lock = threading.Lock()
_changed = threading.Condition(_lock)
_armed: dict[str, str] = {}
_hits: Counter[str] = Counter()
_signals: Counter[str] | None = None  # None: signals off
_blocked: Counter[str] = Counter()
_released: set[str] = set()
_generation = 0  # bumped by disarm_all: every blocked thread goes on


def arm(name: str, action: str) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; known points: {', '.join(POINTS)}")
    with _lock:
        _armed[name] = action


def disarm_all() -> None:
    """Forget armed points, hit counts and releases; let blocked threads go."""
    global _generation
    with _changed:
        _armed.clear()
        _hits.clear()
        _released.clear()
        _generation += 1
        _changed.notify_all()


def load_from_env() -> None:
    for item in filter(None, os.environ.get("REORG_FAULTS", "").split(",")):
        name, _, action = item.partition("=")
        arm(name.strip(), action.strip())


# --- signals -------------------------------------------------------------------


def enable_signals() -> None:
    """Record every hit from now on (until ``disable_signals``)."""
    global _signals
    with _lock:
        _signals = Counter()


def disable_signals() -> None:
    global _signals
    with _lock:
        _signals = None


def signal(name: str) -> None:
    """Record one hit of ``name`` for ``wait``; a no-op while signals are off."""
    with _changed:
        if _signals is not None:
            _signals[name] += 1
            _changed.notify_all()


def wait(name: str, timeout: float = 30.0) -> None:
    """Wait for a hit of ``name`` not yet consumed by an earlier ``wait``, and
    consume it. Signals must be on."""
    with _changed:
        if _signals is None:
            raise RuntimeError("faults.wait needs faults.enable_signals() first")
        if not _changed.wait_for(lambda: _signals is not None and _signals[name] > 0, timeout):
            raise AssertionError(f"timed out after {timeout:g}s waiting for signal {name}")
        _signals[name] -= 1


# --- blocking ------------------------------------------------------------------


def release(name: str) -> None:
    """Let every thread blocked at ``name`` go on, and later hits pass."""
    with _changed:
        _released.add(name)
        _changed.notify_all()


def blocked(name: str) -> int:
    """How many threads of this process are blocked at ``name`` now."""
    with _lock:
        return _blocked[name]


def wait_blocked(name: str, timeout: float = 30.0, count: int = 1) -> None:
    """Wait until ``count`` threads of this process are blocked at ``name``."""
    with _changed:
        if not _changed.wait_for(lambda: _blocked[name] >= count, timeout):
            raise AssertionError(f"timed out after {timeout:g}s waiting for {count} "
                                 f"thread(s) blocked at {name} ({_blocked[name]} are)")


def _block(name: str, count: int) -> None:
    directory = os.environ.get("REORG_FAULTS_DIR")
    gates = Gates(Path(directory)) if directory else None
    marker = gates.marker(name, count) if gates else None
    if marker:
        marker.touch()
    try:
        with _changed:
            generation = _generation
            _blocked[name] += 1
            _changed.notify_all()
            while not (name in _released or generation != _generation
                       or (gates is not None and gates.is_released(name))):
                _changed.wait(_POLL_SECONDS if gates else None)
            _blocked[name] -= 1
    finally:
        if marker:
            marker.unlink(missing_ok=True)


@dataclass(frozen=True)
class Gates:
    """``block`` across processes: the test's side of the files in ``directory``
    (give the processes ``env()``)."""

    directory: Path

    def env(self) -> dict[str, str]:
        return {"REORG_FAULTS_DIR": str(self.directory)}

    def marker(self, name: str, count: int) -> Path:
        return self.directory / f"{name}.{os.getpid()}.{count}.blocked"

    def is_released(self, name: str) -> bool:
        return (self.directory / f"{name}.released").exists()

    def blocked(self, name: str) -> list[int]:
        """Pids of the threads blocked at ``name`` now, one entry per thread."""
        return sorted(int(p.name[len(name) + 1:].split(".")[0])
                      for p in self.directory.glob(f"{name}.*.blocked"))

    def wait_blocked(self, name: str, timeout: float = 60.0, count: int = 1) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(pids := self.blocked(name)) < count:
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {count} "
                                     f"thread(s) blocked at {name} ({len(pids)} are)")
            time.sleep(_POLL_SECONDS)
        return pids

    def release(self, name: str) -> None:
        (self.directory / f"{name}.released").touch()


# --- the point itself ------------------------------------------------------------


def hit(name: str) -> None:
    if not _armed and _signals is None:
        return
    signal(name)
    with _lock:
        action = _armed.get(name)
        if action is None:
            return
        _hits[name] = count = _hits[name] + 1
    action, _, nth = action.partition("@")
    if nth and int(nth) != count:
        return
    kind, _, arg = action.partition(":")
    if kind == "exit":
        os._exit(137)
    elif kind == "sleep":
        time.sleep(float(arg))
    elif kind == "stop":
        # To this thread, not the process: a process-directed SIGSTOP is taken
        # by whichever thread the kernel picks, and until that one stops the
        # group this thread runs on (it has committed a batch that way).
        _os_signal.pthread_kill(threading.get_ident(), _os_signal.SIGSTOP)
    elif kind == "block":
        _block(name, count)
    elif kind == "raise":
        raise RuntimeError(f"fault {name}")
    elif kind == "retryable":
        raise RetryableError(f"fault {name}")
    else:
        raise ValueError(f"unknown fault action {action!r} for {name}")


load_from_env()
