"""Timed laps, and running a contender fairly on a shared machine."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from bench.dataplane.proctree import Neighbours
from bench.dataplane.server import reset_table

T = TypeVar("T")


@dataclass
class Lap:
    seconds: float = float("nan")


@contextlib.contextmanager
def timed(label: str) -> Iterator[Lap]:
    """``with timed("x") as lap:`` ... afterwards ``lap.seconds`` is the wall time."""
    lap = Lap()
    began = time.perf_counter()
    yield lap
    lap.seconds = time.perf_counter() - began
    print(f"    {label}: {lap.seconds:.2f} s", flush=True)


def contend(url: str, neighbours: Neighbours, retries: int, run: Callable[[], T],
            *, old_values: bool = False) -> tuple[T, float | None]:
    """Reset the table, wait for a quiet machine and run one contender; run it
    again (up to ``retries`` times) when other processes took a sizeable share
    of the CPUs meanwhile. Returns the last result and the CPU seconds other
    processes used during it. ``old_values``: the table is reset with c
    holding a value in every row (``server.reset_table``)."""
    attempt = 0
    while True:
        reset_table(url, old_values=old_values)
        neighbours.settle()
        with neighbours.measured() as others:
            result = run()
        if not others.disturbed or attempt == retries:
            return result, others.cpu_seconds
        attempt += 1
        print(f"    other processes took {others.cpu_seconds:.1f} s of CPU meanwhile: again",
              flush=True)
