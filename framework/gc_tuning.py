"""The garbage collector of a long-running worker process.

Why: a worker process running quick subtasks allocates a few dozen
container objects per subtask (its context, claim, callbacks, the statements'
parameters), so CPython's default young generation (700 allocations) is
collected hundreds of times a second, and every tenth of those sweeps run into
a full collection of the ~80,000 objects that start-up built (modules,
SQLAlchemy's and the job types' caches): a fifth of a busy worker's CPU
(docs/benchmarks.md, "Framework at scale"). A finished subtask must also leave
no reference cycle, so that its reference counts free it
(``test_grouped_batches.py::test_a_finished_subtask_is_freed_without_the_garbage_collector``).

Nothing is kept alive by this: frozen objects are still freed when their
reference count drops to zero; only cycles among them wait, and start-up's
objects live as long as the process anyway.
"""

from __future__ import annotations

import gc

# Allocations between young collections; CPython's default is 700.
YOUNG = 10_000
# Young collections between middle ones, middle between full ones (20, 100:
# a full collection now sweeps only what survived since start-up).
MIDDLE = 20
OLD = 100


def settle_after_start() -> None:
    """Call once the process has started everything it keeps for its life:
    moves those objects out of the collector's sweeps, and collects the
    young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
