"""A worker on another "host" (network namespace) is partitioned from the
database mid-job: another worker takes over once its lease expires, and when
the partition heals none of the partitioned worker's writes land (DESIGN 2, 3)."""

from __future__ import annotations

import pytest
from netns import Host, Relay, netns_available
from sqlalchemy.engine import make_url
from support import fill, make_items, table_rows, wait_until

from framework import control
from framework.submit import submit

pytestmark = [pytest.mark.fault,
              pytest.mark.skipif(not netns_available(), reason="needs root and ip netns")]


@pytest.fixture
def remote_host():
    host = Host.create(index=7)
    yield host
    host.destroy()


def test_partitioned_worker_is_replaced_and_lands_nothing_after_healing(db, workers, remote_host):
    url = make_url(db.settings.database_url)
    relay = Relay((remote_host.gateway, 15432), (url.host, url.port)).start()
    try:
        make_items(db, 6_000)
        job_id = submit(db, fill("md5(b) || ':' || txid_current()", rows_per_subtask=3_000,
                                 batch_rows=100, concurrency=1)).job_id
        remote_url = url.set(host=remote_host.gateway, port=15432).render_as_string(
            hide_password=False)
        # far stops after its first committed batch until released.
        far = workers.start("far", slots=1, prefix=remote_host.command,
                            faults="worker.after_batch=block", REORG_DATABASE_URL=remote_url)

        def far_progress():
            with db.begin() as conn:
                return conn.execute(db.sql(
                    "SELECT id FROM {s}.background_subtask WHERE exec_id = 'far' "
                    "AND state = 'running' AND curr_key > start_key")).scalar()

        workers.gates.wait_blocked("worker.after_batch", 60)
        sub_id = far_progress()
        assert sub_id, "far worker made progress"
        remote_host.partition()
        workers.gates.release("worker.after_batch")  # far's next batch meets the partition
        workers.start("near", slots=2)
        state = wait_until(lambda: (s := control.status(db, job_id)[0]["state"])
                           in {"succeeded", "reverted", "cancelled"} and s, 90, "job to finish")
        assert state == "succeeded"
        with db.begin() as conn:
            holder = conn.execute(db.sql(
                "SELECT exec_id FROM {s}.background_subtask WHERE id = :i UNION ALL "
                "SELECT exec_id FROM {s}.background_subtask_history WHERE id = :i"),
                {"i": sub_id}).scalar()
            bad = conn.execute(db.sql(
                "SELECT count(*) FROM items WHERE d NOT LIKE md5(b) || ':%'")).scalar()
        assert holder == "near" and bad == 0
        snapshot = table_rows(db)
        remote_host.heal()
        wait_until(lambda: f"subtask {sub_id} " in far.log() and ": lost" in far.log(), 60,
                   "far worker to give the subtask up")
        assert table_rows(db) == snapshot
    finally:
        relay.stop()
