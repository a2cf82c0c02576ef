"""Chunks of the key space handed out in order to parallel autocommit
connections: the way the SQL baselines (and the big table's load) spread a
statement over the machine's cores, as people do without reorg."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from bench.dataplane.errors import BenchError


def in_parallel(url: str, connections: int, starts: Iterator[int],
                chunk: Callable[[psycopg.Connection[Any], int], object], what: str) -> None:
    """Run ``chunk(conn, start)`` for every start of ``starts``, taken in
    order by ``connections`` threads, each on an autocommit connection of its
    own, until none is left. ``chunk`` runs concurrently: what it counts needs
    a lock. The first error fails the whole (``BenchError``, naming ``what``)
    once every thread has stopped."""
    lock = threading.Lock()
    errors: list[BaseException] = []

    def take() -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                while True:
                    with lock:
                        start = next(starts, None)
                    if start is None:
                        return
                    chunk(conn, start)
        except BaseException as exc:  # reported by the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=take) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"{what} failed: {errors[0]}")
