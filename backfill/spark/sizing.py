"""How much work a Spark subtask and its batches get: the default range size
(``ROWS_PER_SUBTASK``) and the adaptive batch size, steered toward a target time.

A batch is the unit a crash redoes: its merge and its checkpoint commit
together or not at all, so a worker killed mid-batch loses at most the batch
it was merging, and re-reads what its Spark reads held beyond it (a read
covers ``batches_per_read`` batches; ``pipeline``). Batches
therefore never exceed the job's ``batch_rows``: the sizer only shrinks them
(down to ``batch_rows / 8``) when a batch takes longer than the target time
(lock hold time, the statement timeout), and grows them back toward
``batch_rows``, never beyond what the rate limit allows in one target period.
Spark's fixed cost per job (scheduling, a JDBC connection and query) is
shared by the batches of a read. (It used to grow batches to 32x ``batch_rows``,
147,000 rows at the default 10,000, which a kill -9 then redid.)
"""

from __future__ import annotations

from dataclasses import dataclass

# A Spark subtask pays a fixed cost (plan, JDBC connection, pipeline fill and
# drain); 250k-row ranges keep it small while still giving many hosts work,
# and leave a fifth of the subtasks to claim, checkpoint and move to history.
# (At 1M rows the two sizes ran within 4 %: docs/benchmarks.md, "Measured apart".)
# An explicit --rows-per-subtask overrides it (framework.submit).
ROWS_PER_SUBTASK = 250_000
MIN_ROWS = 100
GROW_LIMIT = 3.0  # at most x3 (or /2) per batch: ramps up fast, one noisy batch can't swing it far
SHRINK_LIMIT = 0.5
RANGE_BELOW = 8  # bounds: [batch_rows / 8, batch_rows * range_above]
RANGE_ABOVE = 1
# A read-only type (checksum) writes nothing a crash could make it redo but
# its reads, and its batches are cheap to grow: it may go this far above.
READ_ONLY_RANGE_ABOVE = 32


@dataclass
class BatchSizer:
    batch_rows: int  # the job's setting, starting point and centre of the bounds
    target_seconds: float = 1.0
    rows: int = 0
    range_above: int = RANGE_ABOVE  # upper bound: batch_rows times this

    def __post_init__(self) -> None:
        self.rows = self.batch_rows

    @property
    def bounds(self) -> tuple[int, int]:
        low = max(min(MIN_ROWS, self.batch_rows), self.batch_rows // RANGE_BELOW)
        return low, max(low, self.batch_rows * self.range_above)

    def retarget(self, batch_rows: int) -> None:
        """The job's batch_rows was altered: start again from the new value."""
        if batch_rows != self.batch_rows:
            self.batch_rows = batch_rows
            self.rows = batch_rows

    def next_rows(self, rate_limit_per_subtask: float | None = None) -> int:
        low, high = self.bounds
        rows = min(max(self.rows, low), high)
        if rate_limit_per_subtask:
            # One batch should not be more than a target period of the rate budget,
            # or throttling turns into long stalls between huge batches.
            rows = min(rows, max(int(rate_limit_per_subtask * self.target_seconds), 1))
        return max(rows, 1)

    def observe(self, rows: int, seconds: float) -> None:
        """A batch of ``rows`` rows took ``seconds`` (its pipeline stage time)."""
        if self.target_seconds <= 0 or rows <= 0 or seconds <= 0:
            return
        # Anchor on the current size, not on ``rows``: a range's short last
        # batch must not shrink the next subtask's batches to its own size.
        wanted = rows / seconds * self.target_seconds
        wanted = min(max(wanted, self.rows * SHRINK_LIMIT), self.rows * GROW_LIMIT)
        low, high = self.bounds
        self.rows = int(min(max(wanted, low), high))
