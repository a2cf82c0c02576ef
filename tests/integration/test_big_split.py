"""A split of many ranges is inserted a chunk per owner tick (issue 9: the
owner's tick stays bounded), and a sampled split of a big table still tiles
its key space in even ranges (issue 12, DESIGN 5), on a real PostgreSQL."""

from __future__ import annotations

import sqlalchemy as sa
from support import job_of, make_items, scalar, subtask_ranges, wait_until

from framework import control
from framework import owner as owner_module
from framework.keyset_split import plan_split
from framework.node import Node
from framework.owner import Owner
from framework.store import steps
from framework.submit import SubmitRequest, submit
from framework.worker import WorkerPool

CHUNK = 4


def _sql_update(rows_per_subtask: int) -> SubmitRequest:
    return SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                         rows_per_subtask=rows_per_subtask, batch_rows=50)


def _pending(db, job_id: int) -> bool:
    with db.begin() as conn:
        return steps.split_pending(db, conn, job_id)


def test_a_split_goes_in_a_chunk_a_tick_and_the_job_succeeds_only_once_all_are_in(
        db, monkeypatch):
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", CHUNK)
    # One revert range per forward range (10 rows), not merged into one.
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 10)
    make_items(db, 200)
    job_id = submit(db, _sql_update(rows_per_subtask=10)).job_id
    owner, pool = Owner(db, "o1"), WorkerPool(db, "w", 1)
    owner.tick()  # prepare, split: 20 ranges, the first 4 inserted
    started = job_of(db, job_id)
    assert started["state"] == "running"
    assert len(subtask_ranges(db, job_id)) == CHUNK and _pending(db, job_id)
    assert started["pending"] == 20  # status shows the whole job from its start
    while pool.run_one():  # every inserted subtask succeeds...
        pass
    owner.tick()  # ...yet the job does not: 16 ranges are still to insert (DESIGN 7)
    assert job_of(db, job_id)["state"] == "running"
    assert len(subtask_ranges(db, job_id)) == 2 * CHUNK
    owner.resign()  # a new owner carries on where the old one stopped
    successor = Owner(db, "o2")
    for _ in range(10):
        successor.tick()
        while pool.run_one():
            pass
        if job_of(db, job_id)["state"] == "succeeded":
            break
    assert job_of(db, job_id)["state"] == "succeeded"
    assert not _pending(db, job_id)
    ranges = subtask_ranges(db, job_id)
    with db.begin(isolation_level="REPEATABLE READ") as conn:
        plan = plan_split(conn, '"public"."items"', '"id"', 10)
    assert [(lo, hi) for _, lo, hi in ranges] == plan.ranges  # no gap, overlap or repeat
    assert [o for o, _, _ in ranges] == list(range(20))
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0


def test_a_tick_that_leaves_ranges_to_insert_asks_for_the_next_tick_at_once(db, monkeypatch):
    """Each tick inserts one chunk (it stays short); while ranges remain it
    says so, and the node ticks again without waiting for the interval."""
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", CHUNK)
    # One revert range per forward range (10 rows), not merged into one.
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 10)
    make_items(db, 200)
    job_id = submit(db, _sql_update(rows_per_subtask=10)).job_id
    owner = Owner(db, "o1")
    seen = []
    for _ in range(6):
        result = owner.tick()
        seen.append((len(subtask_ranges(db, job_id)), result.again))
    # 20 ranges: the start inserts 4, each later tick 4 more; the tick that
    # inserts the last chunk, and any after it, have nothing left to do at once.
    assert seen == [(4, True), (8, True), (12, True), (16, True), (20, False), (20, False)]
    assert not _pending(db, job_id)


def test_a_small_job_prepared_in_the_same_tick_keeps_a_big_splits_next_chunk_at_once(
        db, monkeypatch):
    """Two queued jobs in one tick: the first's split leaves ranges to insert,
    the second's fits in a chunk. The tick still asks to come again at once
    (the second's prepare used to overwrite that with False)."""
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", CHUNK)
    # One revert range per forward range (10 rows), not merged into one.
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 10)
    make_items(db, 200)
    make_items(db, 20, table="items_b")
    big = submit(db, _sql_update(rows_per_subtask=10)).job_id
    small = submit(db, SubmitRequest("sql-update", {"table": "items_b", "set": "c=md5(b)"},
                                     rows_per_subtask=10, batch_rows=50)).job_id
    result = Owner(db, "o1").tick()
    assert job_of(db, small)["state"] == "running" and _pending(db, big)
    assert result.again


def test_a_node_inserts_a_split_chunk_after_chunk_without_waiting_an_interval(
        db, monkeypatch, settings):
    """No worker claims (no slots) and the owner's interval is a minute: the
    chunks still all go in at once, tick after tick."""
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", CHUNK)
    # One revert range per forward range (10 rows), not merged into one.
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 10)
    make_items(db, 200)
    job_id = submit(db, _sql_update(rows_per_subtask=10)).job_id
    node = Node(settings, node_id="n1", slots=0, owner_tick_seconds=60)
    node.start()  # its first tick starts the job
    try:
        wait_until(lambda: len(subtask_ranges(db, job_id)) == 20 and not _pending(db, job_id),
                   timeout=20, message="every chunk of the split inserted")
    finally:
        node.drain(timeout=10)


def test_a_job_cancelled_mid_split_inserts_no_more_ranges_and_is_restored(db, monkeypatch):
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", CHUNK)
    # One revert range per forward range (10 rows), not merged into one.
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 10)
    make_items(db, 200)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old-' || id"))
    job_id = submit(db, _sql_update(rows_per_subtask=10)).job_id
    owner, pool = Owner(db, "o1"), WorkerPool(db, "w", 1)
    owner.tick()
    assert pool.run_one()  # one range written
    control.cancel(db, job_id)
    for _ in range(10):
        owner.tick()
        while pool.run_one():
            pass
        if job_of(db, job_id)["state"] == "cancelled":
            break
    assert job_of(db, job_id)["state"] == "cancelled"
    assert not _pending(db, job_id)
    forward = [r for r in subtask_ranges(db, job_id) if r[0] >= 0]
    assert scalar(db, "SELECT count(*) FROM {s}.background_subtask WHERE job_id = :j "
                      "AND step >= 0", j=job_id) + scalar(
        db, "SELECT count(*) FROM {s}.background_subtask_history WHERE job_id = :j "
            "AND step >= 0", j=job_id) == CHUNK, forward
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM 'old-' || id") == 0


def test_a_revert_of_many_ranges_goes_in_a_chunk_a_tick_and_restores_them_all(
        db, monkeypatch):
    """DESIGN 13 at scale: one revert range per forward range that made
    progress, inserted like a big split, and the job ends only once every
    one of them was inserted and restored."""
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", CHUNK)
    # One revert range per forward range (10 rows), not merged into one.
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 10)
    make_items(db, 200)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old-' || id"))
    job_id = submit(db, _sql_update(rows_per_subtask=10)).job_id
    owner, pool = Owner(db, "o1"), WorkerPool(db, "w", 1)
    for runs in (4, 4, 2):  # 12 of the 20 ranges inserted, 10 of them written
        owner.tick()
        for _ in range(runs):
            assert pool.run_one()
    written = [(lo, hi) for _, lo, hi in subtask_ranges(db, job_id)][:10]
    control.cancel(db, job_id)
    owner.tick()  # wind down: the forward split stops
    owner.tick()  # the revert step: its first 4 ranges, 6 kept for later ticks
    with db.begin() as conn:
        reverts = conn.execute(db.sql(
            "SELECT count(*) FROM {s}.background_subtask WHERE job_id = :j AND step = -1"),
            {"j": job_id}).scalar()
    assert reverts == CHUNK and _pending(db, job_id)
    assert job_of(db, job_id)["state"] == "reverting"
    for _ in range(10):
        while pool.run_one():
            pass
        owner.tick()
        if job_of(db, job_id)["state"] == "cancelled":
            break
    assert job_of(db, job_id)["state"] == "cancelled" and not _pending(db, job_id)
    with db.begin() as conn:
        restored = conn.execute(db.sql("""
            SELECT ordinal, start_key, end_key FROM {s}.background_subtask
            WHERE job_id = :j AND step = -1
            UNION ALL
            SELECT ordinal, start_key, end_key FROM {s}.background_subtask_history
            WHERE job_id = :j AND step = -1 ORDER BY 1"""), {"j": job_id}).all()
    assert [(lo, hi) for _, lo, hi in restored] == written
    assert [o for o, _, _ in restored] == list(range(10))
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM 'old-' || id") == 0


def _sampled(db, table: str) -> tuple[list[tuple[int, int]], list[int]]:
    with db.begin(isolation_level="REPEATABLE READ") as conn:
        conn.execute(sa.text(f"ANALYZE {table}"))
    with db.begin(isolation_level="REPEATABLE READ") as conn:
        plan = plan_split(conn, f'"public"."{table}"', '"id"', 5_000, exact_max_rows=0)
        again = plan_split(conn, f'"public"."{table}"', '"id"', 5_000, exact_max_rows=0)
        counts = [conn.execute(sa.text(f"SELECT count(*) FROM {table} "
                                       "WHERE id >= :lo AND id < :hi"),
                               {"lo": lo, "hi": hi}).scalar() for lo, hi in plan.ranges]
    assert plan.ranges == again.ranges  # deterministic (DESIGN 5)
    assert all(a[1] == b[0] for a, b in zip(plan.ranges, plan.ranges[1:], strict=False))
    return plan.ranges, counts


def test_a_sampled_split_of_keys_stored_in_key_order_is_even_from_few_sampled_pages(
        db, monkeypatch):
    """A table loaded in key order, sampled at ~7 pages per range: a page holds
    neighbouring keys, so cuts at the sample's own quantiles were off by whole
    pages (ranges 0.5x-1.6x even); buckets refined at equal key widths are not."""
    from framework import splitting

    monkeypatch.setattr(splitting, "MAX_SAMPLE_ROWS", 40_000)
    monkeypatch.setattr(splitting, "DENSE_KEYS_SHARE", 2.0)  # the sample even on dense keys
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE ordered (id bigint PRIMARY KEY, b text)"))
        conn.execute(sa.text("INSERT INTO ordered SELECT g, 'item ' || g "
                             "FROM generate_series(1, 200000) g"))
    ranges, counts = _sampled(db, "ordered")
    assert ranges[0][0] == 1 and ranges[-1][1] == 200_001
    assert sum(counts) == 200_000
    assert max(counts) <= 1.2 * 5_000 and min(counts) >= 0.8 * 5_000, counts


def test_a_sampled_split_of_keys_stored_out_of_order_tiles_them_evenly(db, monkeypatch):
    """Rows stored in an order unrelated to their keys (as after years of
    updates), sampled from a part of the table only (the sampled path of a
    table far above the exact-split threshold)."""
    from framework import splitting

    monkeypatch.setattr(splitting, "MAX_SAMPLE_ROWS", 40_000)
    monkeypatch.setattr(splitting, "DENSE_KEYS_SHARE", 2.0)  # the sample even on dense keys
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE shuffled (id bigint PRIMARY KEY, b text)"))
        conn.execute(sa.text("INSERT INTO shuffled SELECT g, 'item ' || g "
                             "FROM generate_series(1, 200000) g ORDER BY md5(g::text)"))
    ranges, counts = _sampled(db, "shuffled")
    assert ranges[0][0] == 1 and ranges[-1][1] == 200_001
    assert sum(counts) == 200_000
    assert 35 <= len(ranges) <= 45
    assert max(counts) <= 1.5 * 5_000 and min(counts) >= 0.5 * 5_000, counts


def test_a_sampled_split_of_skewed_keys_still_covers_every_row(db, monkeypatch):
    """Dense keys, then a sparse run of keys a thousand apart: equal key widths
    would put nearly every row in a few ranges; the sample's buckets follow
    the skew."""
    from framework import splitting

    monkeypatch.setattr(splitting, "MAX_SAMPLE_ROWS", 60_000)
    monkeypatch.setattr(splitting, "SAMPLED_PAGES_PER_BUCKET", 50)
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE skewed (id bigint PRIMARY KEY, b text)"))
        conn.execute(sa.text("INSERT INTO skewed SELECT g, 'item ' || g "
                             "FROM generate_series(1, 150000) g"))
        conn.execute(sa.text("INSERT INTO skewed SELECT 10000000 + g * 1000, 'item ' || g "
                             "FROM generate_series(1, 50000) g"))
    ranges, counts = _sampled(db, "skewed")
    assert ranges[0][0] == 1 and ranges[-1][1] == 10_000_000 + 50_000 * 1000 + 1
    assert sum(counts) == 200_000
    assert max(counts) <= 2 * 5_000, counts


def _keys_with_a_gap(db, table: str, rows: int, gap: tuple[int, int]) -> None:
    """``table`` with keys 1..rows, stored out of key order, but those in ``gap``."""
    with db.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, b text)"))
        conn.execute(sa.text(f"INSERT INTO {table} SELECT g, 'item ' || g "
                             "FROM generate_series(1, :n) g ORDER BY md5(g::text)"), {"n": rows})
        conn.execute(sa.text(f"DELETE FROM {table} WHERE id BETWEEN :lo AND :hi"),
                     {"lo": gap[0], "hi": gap[1]})


def test_dense_keys_are_cut_at_equal_widths_without_a_sample(db):
    """Keys that fill their span (a serial key with a tenth of its rows
    deleted in one block): equal key widths, no range above its width, every
    row in exactly one range."""
    _keys_with_a_gap(db, "dense", 200_000, (50_001, 70_000))
    ranges, counts = _sampled(db, "dense")
    assert ranges[0][0] == 1 and ranges[-1][1] == 200_001
    widths = [hi - lo for lo, hi in ranges]
    assert max(widths) - min(widths) <= 1, widths  # the sample's buckets would differ
    assert len(ranges) == 36  # 180,000 analysed rows, 5,000 a range
    assert sum(counts) == 180_000
    assert max(counts) <= max(widths) <= 5_556, counts  # 5,000 / DENSE_KEYS_SHARE


def test_keys_that_do_not_fill_their_span_are_still_cut_from_a_sample(db):
    """Half the span empty: its gap could be anywhere, so the sample's
    buckets decide where the ranges are cut, not equal widths."""
    _keys_with_a_gap(db, "halved", 300_000, (100_001, 250_000))
    ranges, counts = _sampled(db, "halved")
    assert ranges[0][0] == 1 and ranges[-1][1] == 300_001
    assert sum(counts) == 150_000
    widths = [hi - lo for lo, hi in ranges]
    assert max(widths) - min(widths) > 1, widths
