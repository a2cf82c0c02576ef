"""How many subtasks a slot claims at once (``framework.worker.ClaimSize``):
a pile of quick ones, one long one, and a size that belongs to the job its
subtasks were timed on."""

from framework.worker import ClaimSize


def test_a_slot_that_timed_nothing_claims_one_of_any_job():
    assert ClaimSize().next() == (1, None)


def test_quick_subtasks_are_claimed_up_to_the_limit_and_long_ones_one_at_a_time():
    size = ClaimSize(limit=32)
    size.observe(7, 0.0005)
    assert size.next() == (32, 7)
    size.observe(7, 0.02)  # a moving average: still several
    assert 1 < size.next()[0] < 32
    for _ in range(30):
        size.observe(7, 0.2)
    assert size.next() == (1, 7)


def test_another_jobs_subtask_replaces_the_estimate_instead_of_joining_it():
    size = ClaimSize(limit=32)
    for _ in range(10):
        size.observe(7, 0.0005)
    size.observe(8, 0.06)  # blended into job 7's average, it would say 8
    assert size.next() == (1, 8)
