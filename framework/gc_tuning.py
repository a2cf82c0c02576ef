"""The garbage collector of a long-running worker process.

Why (``bench/framework_scale.py``, issue 9): a worker process running quick
subtasks allocates a few dozen container objects per subtask (its context,
claim, callbacks, the statements' parameters), so CPython's default young
generation (700 allocations) is collected hundreds of times a second, and
every tenth of those sweeps run into a full collection of the ~80,000 objects
that start-up built (modules, SQLAlchemy's and the job types' caches). Measured
with ``gc.callbacks`` in each of the benchmark's four worker processes: 0.9 of
their ~4.6 CPU seconds in the collector (~20 %). Frozen start-up objects and
a young generation of 10,000 took it to ~0.45 s; no reference cycle per
subtask any more (``framework.worker``: the context's callbacks hold the
slot's record weakly) to ~0.075 s.

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
