"""bench.dataplane.window_cpu: a window's CPU by who used it, on a real
server, including backends that begin and end inside the window (a
baseline's own connections), which no snapshot of pg_stat_activity sees."""

from __future__ import annotations

import psycopg

from bench.dataplane.window_cpu import ENDED_BACKENDS, WindowCpu

# A query that keeps one backend busy for about a second of CPU.
BUSY = "SELECT count(*) FROM generate_series(1, 8000000)"


def test_a_backend_that_ends_inside_the_window_is_counted_and_a_live_one_by_its_name(
        fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True, application_name="probe-7") as live:
        window = WindowCpu(fresh_db, {})
        window.start()
        live.execute(BUSY)
        with psycopg.connect(fresh_db, autocommit=True) as short_lived:
            short_lived.execute(BUSY)
            ended = short_lived.info.backend_pid
        used = window.stop(ended=[ended])
    # Each query is ~1 CPU-s on this machine; a tenth of that is no noise.
    # (Other tests' backends on the same server may add to either group, so
    # only the lower bounds are facts.)
    assert used.get("probe-N", 0.0) > 0.1, used
    assert used.get(ENDED_BACKENDS, 0.0) > 0.1, used

