"""The big-table figures as a section of docs/benchmarks.md, below the
hand-kept marker (the data-plane benchmark rewrites only what is above it);
an earlier section under the same heading is replaced, everything else kept."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bench.bigtable.measure import Cancel, Evenness, Rate, Start
from bench.dataplane.errors import BenchError
from bench.dataplane.window_cpu import describe

HEADING = "## 100M rows"
MARKER = "<!-- Below: kept by hand"
SUBMIT_TARGET = 10.0  # seconds, submit -> running (issue 12)


@dataclass
class Results:
    stamp: str
    rows: int
    size: str
    postgres: str
    server: str
    build_seconds: float | None
    window: float
    start: Start
    evenness: Evenness
    reorg: Rate
    chunked: Rate
    cancel: Cancel
    old_values: bool = False  # c held a value in every row: a before-image per row written


def section(res: Results, heading: str) -> str:
    low, mid, high = res.evenness.figures()
    c_was = ("c held a value in every row, so the job kept a before-image of each row it "
             "wrote" if res.old_values else "c NULL in every row, so the job kept no "
             "before-image, only its batch records")
    wrote = ("overwriting, a before-image per row" if res.old_values
             else "a NULL column: the guarded bare UPDATE, no images")
    built = ("reused from an earlier run" if res.build_seconds is None
             else f"built in {res.build_seconds:.0f} s")
    start, reorg, chunked, cancel = res.start, res.reorg, res.chunked, res.cancel
    rows = [
        ("`reorg submit sql-update --set c=md5(b)` → job `running`",
         f"{start.wall_seconds:.2f} s (target ≤ {SUBMIT_TARGET:.0f} s); "
         f"{start.db_seconds:.2f} s from `created_at` to the running event; "
         f"the submit command alone {start.submit_seconds:.2f} s"),
        ("the split", start.detail),
        (f"rows per range, {len(res.evenness.counted)} of {res.evenness.ranges} ranges counted",
         f"min {low:,} / median {mid:,.0f} / max {high:,} "
         f"(max/median {high / mid:.2f}, min/median {low / mid:.2f})"),
        (f"reorg `sql-update` ({wrote}), {res.window:.0f} s window",
         f"{reorg.rows:,} rows, {reorg.per_second:,.0f} rows/s"),
        (f"2-connection 10k-key chunked SQL, {res.window:.0f} s window",
         f"{chunked.rows:,} rows, {chunked.per_second:,.0f} rows/s"),
        ("cores busy over reorg's window, by who",
         describe(reorg.cpu, reorg.seconds)),
        ("cores busy over chunked SQL's window, by who",
         describe(chunked.cpu, chunked.seconds)),
        ("rows/s, reorg / chunked SQL (issue 25 target 4: ≥ 0.95)",
         f"{reorg.per_second / chunked.per_second:.2f}"),
        ("`reorg cancel` → job `cancelled`",
         f"{cancel.seconds:.2f} s; {cancel.revert_ranges} revert ranges restored "
         f"{cancel.touched_rows:,} rows, {cancel.still_set} left changed"),
        ("the owner's longest transaction meanwhile (`pg_stat_activity`, sampled)",
         f"{cancel.owner_longest_transaction:.2f} s"),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"""{heading}

Measured by `python -m bench.bigtable` ({res.stamp}) on `bench.items` of
{res.rows:,} rows ({res.size} with its primary key; {built}; {c_was}), {res.postgres},
{res.server}, {os.cpu_count()} CPUs; one
`reorg worker --slots 2`, every reorg setting at its default.

| measure | value |
| --- | --- |
{table}

The rates come from equal time windows, not whole passes: a full pass over
{res.rows:,} rows would take hours on this machine. reorg's window
starts at the job's first ranges, chunked SQL's at the middle of the key
space, so both update rows never updated before. Each window begins just
after a `CHECKPOINT`, so both write a full-page image of each page they first
change, and no timed checkpoint falls inside a window shorter than
`checkpoint_timeout`.
"""


def write(res: Results, doc: Path, heading: str) -> None:
    text = doc.read_text() if doc.exists() else ""
    if MARKER not in text:
        raise BenchError(f"{doc} has no line starting {MARKER!r}: nothing to write below")
    head, _, tail = text.partition(MARKER)
    marker_line, _, below = tail.partition("\n")
    new = section(res, heading)
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(below):
        below = pattern.sub(lambda _: new + "\n", below, count=1)
    else:
        below = below.rstrip("\n") + "\n\n" + new
    doc.write_text(head + MARKER + marker_line + "\n" + below)
