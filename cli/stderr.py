"""Hide what child processes (Spark's JVM) write to stderr while a command runs."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def child_stderr_hidden(*, enabled: bool) -> Iterator[None]:
    """Send what child processes started meanwhile write to stderr to
    /dev/null, for their whole life, while this process's own ``sys.stderr``
    stays on the real stderr.

    The child is Spark's JVM, which validation starts for the Spark job
    types: it prints start-up banners ("WARNING: Using incubator modules",
    "Setting default log level") and logs failed dry-run tasks, none of which
    may come before the one ``error:`` line of a rejected submit (DESIGN 11).
    Its failures reach us as exceptions anyway. ``--debug`` shows everything.
    """
    saved = _dup_stderr() if enabled else None
    if saved is None:
        yield
        return
    # Python's writes keep going to the real stderr through a copy of it. It
    # stays open afterwards: a logging handler created meanwhile may hold it.
    real = open(os.dup(saved), "w", buffering=1,  # noqa: SIM115
                encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                errors="backslashreplace")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    before, sys.stderr = sys.stderr, real
    try:
        yield
    finally:
        real.flush()
        sys.stderr = before
        os.dup2(saved, 2)
        os.close(saved)


def _dup_stderr() -> int | None:
    try:
        sys.stderr.flush()
        return os.dup(2)
    except (OSError, ValueError):  # no stderr to save: nothing to hide either
        return None
