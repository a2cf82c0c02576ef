"""Job types' warm-ups run off the owner's tick.

A type's ``warm_up`` (e.g. starting Spark) can take seconds the first time in
a process. The owner needs it before it analyses a job of that type, but must
not stall every other job's tick meanwhile: it starts the warm-up on a thread
of its own and looks again when the warm-up ends (``on_done`` wakes the
owner), not at its next interval: a second of a first Spark submit's wait
for the owner's verdict (``bench.cli_times``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from framework.jobtype import JobType
from framework.records import Job


class Warming:
    def __init__(self, on_done: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._started: dict[str, Future[None]] = {}
        self._on_done = on_done  # called when a warm-up ends, well or not

    def ready(self, kind: JobType, job: Job | None) -> bool:
        """True once ``kind``'s warm-up is done in this process; starts it
        (once) in the background otherwise. A warm-up that failed raises its
        error here, once, and is tried again at the next call."""
        name = kind.name
        with self._lock:
            future = self._started.get(name)
            if future is None:
                future = self._started[name] = Future()
                threading.Thread(target=_run, args=(future, kind, job, self._on_done),
                                 name=f"warm-up {name}", daemon=True).start()
        if not future.done():
            return False
        error = future.exception()
        if error is not None:
            with self._lock:
                self._started.pop(name, None)
            raise error
        return True


def _run(future: Future[None], kind: JobType, job: Job | None,
         on_done: Callable[[], None]) -> None:
    try:
        kind.warm_up(job)
    except BaseException as exc:  # handed to the owner's tick, which reports it
        future.set_exception(exc)
    else:
        future.set_result(None)
    on_done()
