"""The owner acts on a job when something happens to it, not at its next
tick: a submit wakes it (NOTIFY), and so does the commit of a job's last
subtask, so a job advances within a fraction of a second of its last batch
(``reorg wait`` and every script after it wait on that)."""

from __future__ import annotations

from support import TERMINAL, fill, make_items, wait_state, wait_until

from framework.node import Node
from framework.submit import submit


def test_the_last_subtask_wakes_the_owner_to_advance_the_job(db, settings):
    make_items(db, 2_000)
    # Ticks a minute apart: only wake-ups can start and advance the job in time.
    node = Node(settings, node_id="n1", slots=2, owner_tick_seconds=60)
    node.start()
    try:
        wait_until(lambda: node.owner.term is not None, 10, "n1 elected")
        job_id = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=100)).job_id
        assert wait_state(db, job_id, TERMINAL, 20)["state"] == "succeeded"
    finally:
        node.drain(timeout=10)
