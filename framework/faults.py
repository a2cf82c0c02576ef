"""Named fault points for tests (after TiDB's failpoints).

Production code calls ``faults.hit("worker.after_merge")`` at exact stages; it
is a no-op unless armed. Tests arm points in another process through the
``REORG_FAULTS`` environment variable, e.g.
``REORG_FAULTS="worker.before_checkpoint=sleep:30,owner.after_prepare=exit"``.

Actions: ``exit`` (os._exit(137), like kill -9), ``sleep:SECONDS``,
``stop`` (SIGSTOP to itself), ``raise`` (RuntimeError), ``retryable``
(a retryable error). ``@N`` after an action fires it only on the N-th hit.
"""

from __future__ import annotations

import os
import signal
import threading
import time

_lock = threading.Lock()
_armed: dict[str, str] = {}
_hits: dict[str, int] = {}


def arm(name: str, action: str) -> None:
    with _lock:
        _armed[name] = action


def disarm_all() -> None:
    with _lock:
        _armed.clear()
        _hits.clear()


def load_from_env() -> None:
    for item in filter(None, os.environ.get("REORG_FAULTS", "").split(",")):
        name, _, action = item.partition("=")
        arm(name.strip(), action.strip())


def hit(name: str) -> None:
    if not _armed:
        return
    with _lock:
        action = _armed.get(name)
        if action is None:
            return
        _hits[name] = count = _hits.get(name, 0) + 1
    action, _, nth = action.partition("@")
    if nth and int(nth) != count:
        return
    kind, _, arg = action.partition(":")
    if kind == "exit":
        os._exit(137)
    elif kind == "sleep":
        time.sleep(float(arg))
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "raise":
        raise RuntimeError(f"fault {name}")
    elif kind == "retryable":
        from framework.jobtype import RetryableError

        raise RetryableError(f"fault {name}")
    else:
        raise ValueError(f"unknown fault action {action!r} for {name}")


load_from_env()
