"""The owner acts on a job when something happens to it, not at its next
tick: a submit wakes it (NOTIFY), and so does the commit of a job's last
subtask, so a job advances within a fraction of a second of its last batch
(``reorg wait`` and every script after it wait on that)."""

from __future__ import annotations

import threading

from support import TERMINAL, fill, job_of, make_items, wait_state, wait_until
from support.fill import WarmsOnCue

from framework import faults, jobtype
from framework.node import Node
from framework.store import jobs
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



def test_a_job_submitted_during_an_owner_tick_starts_without_waiting_for_the_next(
        db, settings):
    """A NOTIFY that arrives while the owner ticks used to be dropped (the
    scheduler would skip a second run); if the tick had read the jobs before
    the submit committed, the job waited for the next interval (a second by
    default: most of a Spark submit's wait for the owner's verdict)."""
    make_items(db, 1_000)
    node = Node(settings, node_id="n1", slots=2, owner_tick_seconds=60)
    # The node's first tick is held once it is done, until the submit's NOTIFY
    # has reached the node: a tick that read the jobs before the submit.
    real_tick, real_notify = node.owner.tick, node.listener.on_notify
    holding, leave, notified = threading.Event(), threading.Event(), threading.Event()

    def held_tick():  # type: ignore[no-untyped-def]
        result = real_tick()
        if not leave.is_set():
            holding.set()
            leave.wait(30)
        return result

    def noted() -> None:
        real_notify()
        notified.set()

    node.owner.tick, node.listener.on_notify = held_tick, noted  # type: ignore[method-assign]
    node.start()
    try:
        assert holding.wait(20), "the first owner tick never ran"
        notified.clear()
        job_id = submit(db, fill("md5(b)", rows_per_subtask=500, batch_rows=100)).job_id
        assert notified.wait(10), "the submit's NOTIFY never reached the node"
        leave.set()
        assert wait_state(db, job_id, TERMINAL, 20)["state"] == "succeeded"
    finally:
        leave.set()
        node.drain(timeout=10)


def test_the_last_two_subtasks_finishing_together_still_wake_the_owner(db, settings):
    """The job's last two subtasks finish in concurrent transactions, each
    seeing the other still running. A wake-up only from "the one left" was
    sent by neither, and the job waited for the owner's next interval (the
    flake of the test above, under load)."""
    make_items(db, 1_000)
    node = Node(settings, node_id="n1", slots=2, owner_tick_seconds=60)
    real_tick, ticking = node.owner.tick, threading.Event()

    def watched_tick():  # type: ignore[no-untyped-def]
        ticking.set()
        try:
            return real_tick()
        finally:
            ticking.clear()

    node.owner.tick = watched_tick  # type: ignore[method-assign]
    # Both slots hold their one batch's transaction open after its finishing
    # checkpoint, until both are there.
    faults.arm("worker.after_checkpoint", "block")
    node.start()
    try:
        wait_until(lambda: node.owner.term is not None, 10, "n1 elected")
        job_id = submit(db, fill("md5(b)", rows_per_subtask=500, batch_rows=500)).job_id
        faults.wait_blocked("worker.after_checkpoint", 20, count=2)
        # The owner asleep for its 60 s interval: only a wake-up moves it now.
        wait_until(lambda: not ticking.is_set() and not node._owner_woken.is_set(), 10,
                   "the owner idle")
        faults.release("worker.after_checkpoint")
        assert wait_state(db, job_id, TERMINAL, 20)["state"] == "succeeded"
    finally:
        faults.disarm_all()
        node.drain(timeout=10)


def test_a_job_waiting_for_a_warm_up_starts_when_it_ends_not_at_the_next_tick(db, settings):
    """The owner starts a type's warm-up off its tick and looked at the job
    again only at its next interval: a second of every first Spark submit's
    wait after a worker started (``bench.cli_times``)."""
    kind = WarmsOnCue()
    jobtype.register(kind)
    make_items(db, 1_000)
    node = Node(settings, node_id="n1", slots=2, owner_tick_seconds=60)
    node.start()
    try:
        wait_until(lambda: node.owner.term is not None, 10, "n1 elected")
        with db.begin() as conn:  # as a submit leaves it for the owner to analyse
            job_id, _ = jobs.insert(
                db, conn, type=kind.name, params=fill("md5(b)").params,
                target_table='"public"."items"', key_column='"id"', job_key=None,
                priority=10, concurrency=1, batch_rows=100, max_rows_per_sec=None,
                actor="test")
        assert kind.warming.wait(20), "the owner never started the type's warm-up"
        assert job_of(db, job_id)["state"] == "queued"
        kind.go.set()
        assert wait_state(db, job_id, TERMINAL, 20)["state"] == "succeeded"
    finally:
        kind.go.set()
        node.drain(timeout=10)
