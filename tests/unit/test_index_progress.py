"""The percent a concurrent index build reports (backfill.add_index.build):
phases in PostgreSQL's order give a percent that never goes back, below 100
until the subtask's final checkpoint."""

from backfill.add_index.build import _PHASES, percent_of


def test_phases_in_order_never_go_back_and_stay_below_100() -> None:
    seen = []
    for phase in _PHASES:
        seen += [percent_of(phase, 0, 10), percent_of(phase, 5, 10), percent_of(phase, 10, 10)]
    assert seen == sorted(seen)
    assert seen[0] == 0 and max(seen) < 100


def test_a_phase_without_counters_reports_its_start_and_an_unknown_one_zero() -> None:
    assert percent_of("building index: scanning table", None, None) == 3
    assert percent_of("building index: scanning table", 50, 100) == 26
    assert percent_of("something new", 1, 2) == 0
