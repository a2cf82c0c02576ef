"""``reorg worker`` settles the garbage collector once it has started
(``framework.gc_tuning``): start-up's objects frozen out of its sweeps, the
young generation collected less often."""

from __future__ import annotations

import gc

from framework import gc_tuning


def test_settling_freezes_what_exists_and_raises_the_young_threshold():
    before = gc.get_threshold()
    try:
        gc_tuning.settle_after_start()
        assert gc.get_freeze_count() > 1000  # this test process's modules, at least
        assert gc.get_threshold() == (gc_tuning.YOUNG, gc_tuning.MIDDLE, gc_tuning.OLD)
        assert gc.get_threshold()[0] > 700  # CPython's default
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

