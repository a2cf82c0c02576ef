"""What used to show only in a worker's log is in the job's events (issue
26): a new owner taking over from the last, a node declared dead while it
held the job's subtasks, and the takeover of those subtasks ("resumed from
curr_key K"), each with the actor conventions of every event (``owner N rev
R`` for the owner, ``worker N`` for a worker). A claim that takes over many
subtasks at once writes one event, not one per subtask."""

from __future__ import annotations

import re
import signal

import pytest
from support import fill, held_by, make_items, started_fill, wait_state, wait_until

from framework import control
from framework.store import subtasks
from framework.submit import submit

pytestmark = pytest.mark.fault


def details(db, job_id: int, starting: str) -> list[dict]:
    return [e for e in control.events(db, job_id) if (e["detail"] or "").startswith(starting)]


def test_a_killed_nodes_death_its_subtasks_takeover_and_the_new_owner_are_job_events(
        db, workers, start_node) -> None:
    make_items(db, 8_000)
    # 8 ranges: not a small job bound to the owner's node (local_job_max_subtasks).
    job = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=200)).job_id
    # The victim owns, and each of its 2 slots holds a subtask it checkpointed.
    victim = workers.start("victim", faults="worker.after_batch=block")
    workers.gates.wait_blocked("worker.after_batch", 60, count=2)
    held = wait_until(lambda: len(h := [r for r in held_by(db, "victim")
                                        if r.curr_key > r.start_key]) == 2 and h, 30,
                      "both subtasks checkpointed")
    checkpoints = {r.id: r.curr_key for r in held}
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)

    # A new owner (no slots) declares the victim dead while its leases last.
    start_node("heir", slots=0, node_dead_after_seconds=1.0)
    dead = wait_until(lambda: details(db, job, "node victim declared dead"), 30,
                      "the victim declared dead")
    owner = details(db, job, "owner changed")
    assert len(owner) == 1 and len(dead) == 1
    rev = int(re.fullmatch(r"owner heir rev (\d+)", owner[0]["actor"]).group(1))
    assert owner[0]["detail"] == (f"owner changed: heir (rev {rev}) took over from victim "
                                  f"(rev {rev - 1}), whose term had ended")
    assert dead[0]["actor"] == f"owner heir rev {rev}"
    assert re.fullmatch(r"node victim declared dead \(no heartbeat for \d+ s\); it held 2 "
                        r"subtasks of this job, which other nodes take over once their leases "
                        r"expire", dead[0]["detail"]), dead[0]["detail"]
    assert {(e["from_state"], e["to_state"]) for e in owner + dead} == {("running", "running")}

    start_node("taker", slots=2)
    assert wait_state(db, job)["state"] == "succeeded"
    taken = details(db, job, "took over")
    assert taken and all(e["actor"] == "worker taker" for e in taken)
    resumed = {int(s): int(k) for e in taken
               for s, k in re.findall(r"subtask (\d+) resumed from curr_key (\d+)", e["detail"])}
    assert resumed == checkpoints
    for e in taken:
        assert re.match(r"took over \d subtasks? of node victim \(its lease expired\): ",
                        e["detail"]), e["detail"]


def test_a_claim_that_takes_over_many_subtasks_writes_one_event(db) -> None:
    job, _ = started_fill(db, 40)
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.jobs SET concurrency = 64"))
        gone = subtasks.claim(db, conn, "gone", limit=40)
        conn.execute(db.sql("UPDATE {s}.background_subtask SET curr_key = to_jsonb("
                            "CAST(start_key AS text)::bigint + 3), "
                            "exec_expired = clock_timestamp() - interval '1 second'"))
    assert len(gone) == 40
    with db.begin() as conn:
        taken = subtasks.claim(db, conn, "heir", limit=32)
    assert len(taken) == 32
    events = details(db, job, "took over")
    assert len(events) == 1
    first = sorted(c.id for c in taken)[:5]
    assert events[0]["actor"] == "worker heir"
    assert events[0]["detail"] == (
        "took over 32 subtasks of node gone (its lease expired): "
        + ", ".join(f"subtask {i} resumed from curr_key {c.start_key + 3}"
                    for i, c in sorted((c.id, c) for c in taken)[:5])
        + ", and 27 more")
    assert first  # ids as the claim returned them
    # Claiming pending subtasks (none held before) writes none.
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.background_subtask SET state = 'pending', "
                            "exec_id = NULL WHERE exec_id = 'gone'"))
        assert len(subtasks.claim(db, conn, "heir", limit=8)) == 8
    assert len(details(db, job, "took over")) == 1


def test_a_node_restarted_with_its_id_hands_back_its_subtasks_in_an_event(db) -> None:
    job, _ = started_fill(db, 3)
    with db.begin() as conn:
        subtasks.claim(db, conn, "w1", limit=3)
        conn.execute(db.sql("UPDATE {s}.background_subtask "
                            "SET curr_key = to_jsonb(CAST(start_key AS text)::bigint + 4)"))
        assert subtasks.requeue_after_restart(db, conn, "w1") == 3
    (event,) = details(db, job, "node w1 restarted")
    assert event["actor"] == "worker w1"
    assert re.fullmatch(r"node w1 restarted: handed back the 3 subtasks its previous run "
                        r"held: subtask \d+ resumes from curr_key 5, subtask \d+ resumes from "
                        r"curr_key 15, subtask \d+ resumes from curr_key 25", event["detail"]), (
        event["detail"])
