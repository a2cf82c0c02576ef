"""The revert step's ranges (``steps.revert_ranges``): touching progressed
ranges of a step restore as one, up to a number of rows; never across a
range's untouched tail or another step (DESIGN 5, 13)."""

from framework.store.steps import Progressed, revert_ranges


def test_touching_done_ranges_merge_up_to_the_rows_and_never_across_an_untouched_tail():
    done = [Progressed(1, lo, lo + 10, lo + 10, 10) for lo in range(0, 100, 10)]
    assert revert_ranges(done, 1_000) == [(1, 0, 100)]
    assert revert_ranges(done, 30) == [(1, 0, 30), (1, 30, 60), (1, 60, 90), (1, 90, 100)]
    partial = [Progressed(1, 0, 10, 10, 10), Progressed(1, 10, 15, 20, 5),
               Progressed(1, 20, 30, 30, 10), Progressed(2, 30, 40, 40, 10)]
    # [15, 20) was never written: the range stops at 15; step 2 stands apart.
    assert revert_ranges(partial, 1_000) == [(1, 0, 15), (1, 20, 30), (2, 30, 40)]


def test_ranges_with_a_gap_between_them_stay_apart():
    apart = [Progressed(1, 0, 10, 10, 10), Progressed(1, 50, 60, 60, 10)]
    assert revert_ranges(apart, 1_000) == [(1, 0, 10), (1, 50, 60)]
