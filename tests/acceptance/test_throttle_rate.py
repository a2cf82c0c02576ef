"""``--max-rows-per-sec`` is the whole job's budget: two ``reorg worker``
processes with two slots each, at the default concurrency, deliver the limit
in all (measured from the table's rows by the database clock), not a quarter
of it nor four times it; ``reorg alter`` changes it live."""

from __future__ import annotations

import time

import pytest
from cli_support import job_status, ok, reorg, submit
from support import Workers, execute, make_items, wait_until

LIMIT = 1_000  # rows/s for the whole job
ROWS = 60_000
# The delivered rate must be within this of the limit (issue 10: ±15 %).
# Measured: within 1 % on a loaded 2-core host (docs/operations.md); the
# per-subtask share paced before delivered 7-18 % over it here, and a quarter
# of it at the default concurrency before that.
TOLERANCE = 0.15


def filled(url: str) -> tuple[int, float]:
    """(rows the job has written, database clock in seconds), one snapshot."""
    return execute(url, "SELECT count(c), extract(epoch FROM clock_timestamp())::float8 "
                        "FROM items")[0]


def running(url: str, job_id: int) -> list[tuple[str, int]]:
    """(node, subtasks) of the job holding a live lease now."""
    return execute(url, """
        SELECT exec_id, count(*)::int FROM reorg.background_subtask
        WHERE job_id = %(j)s AND state = 'running' AND exec_expired > clock_timestamp()
        GROUP BY 1 ORDER BY 1""", {"j": job_id})


def measure(url: str, job_id: int, seconds: float) -> tuple[float, list[int]]:
    """Rows/s the job delivered over ``seconds``, and the numbers of subtasks
    seen running meanwhile (sampled a few times a second)."""
    seen: list[int] = []
    rows0, t0 = filled(url)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(sum(n for _, n in running(url, job_id)))
        time.sleep(0.2)
    rows1, t1 = filled(url)
    return (rows1 - rows0) / (t1 - t0), seen


def test_the_rate_limit_is_the_jobs_across_two_workers_of_two_slots(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, ROWS)
    for node in ("w1", "w2"):
        workers.start_cli(node, "--slots", "2", "--no-spark-warmup")
    wait_until(lambda: execute(url, "SELECT count(*) FROM reorg.nodes")[0][0] == 2, 30,
               "both workers registered")
    # Default concurrency (16): before, each subtask got limit/16 and 4 slots
    # delivered a quarter of the limit.
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--rows-per-subtask", "1000",
                 "--batch-rows", "100", "--max-rows-per-sec", str(LIMIT))
    wait_until(lambda: [n for _, n in running(url, job)] == [2, 2], 30,
               "two subtasks running on each of the two workers")

    rate, seen = measure(url, job, 9)
    print(f"\ndelivered {rate:.0f} rows/s under --max-rows-per-sec {LIMIT} "
          f"(2 workers x 2 slots; running counts seen: {seen})")
    assert abs(rate / LIMIT - 1) <= TOLERANCE, f"{rate:.0f} rows/s against a limit of {LIMIT}"
    assert seen.count(4) > len(seen) // 2, seen

    # Halved live: the workers take it at their next lease renewal.
    assert f"max_rows_per_sec={LIMIT // 2}" in ok(
        reorg(url, "alter", str(job), "--max-rows-per-sec", str(LIMIT // 2)))
    time.sleep(2)  # leases renew every lease_seconds/3: the new budget is in force by then
    rate, _ = measure(url, job, 6)
    print(f"after alter: delivered {rate:.0f} rows/s under --max-rows-per-sec {LIMIT // 2}")
    assert abs(rate / (LIMIT / 2) - 1) <= TOLERANCE, f"{rate:.0f} rows/s against {LIMIT // 2}"
    ok(reorg(url, "cancel", str(job)))


def test_slots_starting_together_do_not_burst_past_the_limit(
        migrated_db: str, workers: Workers) -> None:
    """Four slots idle when the job comes each run a first batch: booked
    only after it ran, the four went at once (4 x 2,000 rows in the first
    instant against 1,000 rows/s). Booked before, they take turns: by any
    moment t after the first commit, at most two batches (the first, and
    one booked from the first's start, not its commit) plus t x the limit."""
    url = migrated_db
    batch = 2_000
    make_items(url, 40_000)
    for node in ("w1", "w2"):
        workers.start_cli(node, "--slots", "2", "--no-spark-warmup")
    wait_until(lambda: execute(url, "SELECT count(*) FROM reorg.nodes")[0][0] == 2, 30,
               "both workers registered")
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--rows-per-subtask", "10000",
                 "--batch-rows", str(batch), "--max-rows-per-sec", str(LIMIT))
    first = wait_until(lambda: (f := filled(url))[0] > 0 and f, 30, "a first batch committed")
    samples = [first]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        samples.append(filled(url))
        time.sleep(0.1)
    print(f"\nrows committed after the first commit: {[(r, round(t - first[1], 2)) for r, t in samples]}")
    for rows, at in samples:
        allowed = 2 * batch + LIMIT * (at - first[1]) * (1 + TOLERANCE)
        assert rows <= allowed, f"{rows} rows {at - first[1]:.2f}s after the first commit"
    ok(reorg(url, "cancel", str(job)))


@pytest.mark.parametrize("new_limit", ["1000000", "0"], ids=["raised", "lifted"])
def test_a_raised_or_lifted_limit_takes_effect_within_a_batch(
        migrated_db: str, workers: Workers, new_limit: str) -> None:
    """At 25 rows/s a batch of 500 rows is booked 20 s apart: the two slots
    sleep their turns, the schedule 40 s ahead. Raised to a million rows/s
    (or lifted, 0), the rest of the job (3,500 rows, milliseconds of work)
    must not wait out the old schedule: the sleeping slots wake, the rows
    booked at the old rate are re-timed at the new one, and the job is done
    within seconds of the alter, not the 20 s and more the old bookings held."""
    url = migrated_db
    make_items(url, 4_000)
    workers.start_cli("w1", "--slots", "2", "--no-spark-warmup")
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--rows-per-subtask", "1000",
                 "--batch-rows", "500", "--max-rows-per-sec", "25")
    wait_until(lambda: filled(url)[0] >= 500, 30, "a first batch committed")
    altered = time.monotonic()
    ok(reorg(url, "alter", str(job), "--max-rows-per-sec", new_limit))
    wait_until(lambda: job_status(url, job)["state"] == "succeeded", 60, "the job succeeded")
    took = time.monotonic() - altered
    print(f"\njob done {took:.1f}s after --max-rows-per-sec 25 -> {new_limit}")
    assert took < 8, f"the job took {took:.1f}s after its limit was altered to {new_limit}"
    assert filled(url)[0] == 4_000


def test_without_batch_rows_a_batch_is_one_second_of_the_limit(
        migrated_db: str, workers: Workers) -> None:
    """A job smaller than the default batch (10,000 rows) under a limit of
    100 rows/s was one batch, all of it written in its first instant. With no
    --batch-rows its batches are one second of the limit, so its 600 rows come
    in over seconds; a --batch-rows given is kept as given."""
    url = migrated_db
    make_items(url, 600)
    workers.start_cli("w1", "--slots", "2", "--no-spark-warmup")
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--max-rows-per-sec", "100")
    first = wait_until(lambda: (f := filled(url))[0] > 0 and f, 30, "a first batch committed")
    last = wait_until(lambda: (f := filled(url))[0] == 600 and f, 60, "every row written")
    took = last[1] - first[1]
    print(f"\n600 rows at 100 rows/s: the first batch {first[0]} rows, the last row {took:.1f}s later")
    assert first[0] <= 200, first  # a batch per slot, not the whole job
    # Two batches may start together; the other four wait their turns.
    assert took >= 4 * (1 - TOLERANCE), f"600 rows at 100 rows/s took {took:.1f}s"
    assert job_status(url, job)["batch_rows"] == 100

    given = submit(url, "--table", "items", "--set", "c=md5(b)", "--batch-rows", "500",
                   "--max-rows-per-sec", "100")
    assert job_status(url, given)["batch_rows"] == 500
    ok(reorg(url, "cancel", str(given)))
