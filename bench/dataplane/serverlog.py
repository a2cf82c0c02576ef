"""The server's statement log during the kill -9 run: Spark's JDBC range reads
of the table, to count the rows read twice."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
from collections.abc import Iterator

from bench.dataplane.records import RangeRead
from bench.dataplane.server import Server, execute

# A Spark JDBC range read of the target, as PostgreSQL logs it (log_statement = all).
# A cursor's later fetches log as "execute fetch from ...": not new reads.
# Log lines start with log_line_prefix '%m [%p] ' (PostgreSQL's default): the time first.
RANGE_READ_RE = re.compile(
    r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) [^\n]*?LOG:  execute (?!fetch from)[^\n]*?'
    r'FROM "bench"\."items"[^\n]*?reorg_src\s+WHERE[^\n]*?\("id" >= (-?\d+)\) AND \("id" < (-?\d+)\)',
    re.MULTILINE)


@contextlib.contextmanager
def statement_log(server: Server) -> Iterator[int | None]:
    """log_statement = 'all' for the duration; yields the log offset to read
    from, or None when the server log is not ours to read or change."""
    if server.log_file is None:
        yield None
        return
    execute(server.url, "ALTER SYSTEM SET log_statement = 'all'", "SELECT pg_reload_conf()")
    time.sleep(0.2)  # the postmaster re-reads the file asynchronously
    offset = server.log_file.stat().st_size
    try:
        yield offset
    finally:
        execute(server.url, "ALTER SYSTEM RESET log_statement", "SELECT pg_reload_conf()")


def range_reads(text: str, rows: int) -> list[RangeRead]:
    """The table's range reads in a piece of server log (keys are dense
    1..rows, so a range [lo, hi) holds hi - lo rows after clipping)."""
    out = []
    for match in RANGE_READ_RE.finditer(text):
        stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        lo, hi = max(int(match.group(2)), 1), min(int(match.group(3)), rows + 1)
        if hi > lo:
            out.append(RangeRead(stamp, lo, hi))
    return out
