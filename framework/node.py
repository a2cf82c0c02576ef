"""One reorg node: a worker pool plus a candidate for owner.

``reorg worker`` runs exactly this. The owner ticks (campaign, then duties
while elected) on a thread of its own, every interval or at once when woken.
The APScheduler loop runs four jobs: heartbeat, owner lease renewal (every
owner ttl/3, apart from the ticks), worker lease renewal (every ttl/3, on its
own connection) and the lease watchdog. SIGTERM drains: stop claiming, let the
current batches commit, release leases at once, resign ownership, deregister.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler

from framework import leases, metrics
from framework.config import Settings
from framework.db import Database
from framework.directdb import DirectDatabase
from framework.errors import one_line
from framework.job_reports import JobReports
from framework.listener import Listener
from framework.owner import Owner
from framework.store import jobs, nodes, subtasks
from framework.version import reorg_version
from framework.worker import WorkerPool

log = logging.getLogger("reorg.node")


def default_node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Node:
    def __init__(self, settings: Settings, *, node_id: str | None = None, slots: int = 2,
                 owner_tick_seconds: float = 1.0, progress_seconds: float = 30.0) -> None:
        """``progress_seconds``: how often the owner logs each running job's
        progress line (0: never)."""
        self.settings = settings
        self.node_id = node_id or default_node_id()
        self.slots = slots
        self.worker_db = Database(settings, role="worker", pool_size=slots + 2)
        self.owner_db = Database(settings, role="owner", pool_size=3)
        self.pool = WorkerPool(self.worker_db, self.node_id, slots)
        self.owner_tick_seconds = owner_tick_seconds
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self.listener = Listener(settings.database_url, jobs.channel(self.worker_db),
                                 self._on_notify)
        self.stopped = threading.Event()
        # A wake-up (NOTIFY) for the owner: its loop waits on it with the tick
        # interval as timeout and clears it before each tick, so one that
        # comes during a tick (which may have read the jobs before the
        # change) makes the next tick start at once. None is lost: a job
        # submitted meanwhile does not wait for the next interval (a second,
        # most of a Spark submit's wait for the owner's verdict).
        self._owner_woken = threading.Event()
        self._owner_stop = threading.Event()
        self.owner = Owner(self.owner_db, self.node_id, wake=self._owner_woken.set)
        self.reports = JobReports(self.owner_db, progress_seconds=progress_seconds)
        # /healthz reads on a connection of its own: a pool busy with batches
        # must not make a healthy node look dead.
        self._health_db = DirectDatabase(settings)
        self._health_lock = threading.Lock()
        self._owner_thread = threading.Thread(target=self._owner_loop, name="reorg-owner",
                                              daemon=True)

    def start(self) -> None:
        metrics.build_info(reorg_version())
        with self.worker_db.begin() as conn:
            released = subtasks.requeue_after_restart(self.worker_db, conn, self.node_id)
            nodes.register(self.worker_db, conn, node_id=self.node_id,
                           host=socket.gethostname(), pid=os.getpid(),
                           version=reorg_version(), slots=self.slots)
        if released:
            log.info("requeued %d subtasks held by a previous run of %s", released,
                     self.node_id)
        every = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        self.scheduler.add_job(self._heartbeat, "interval", id="heartbeat",
                               seconds=self.settings.heartbeat_seconds, **every)
        # The owner's term is renewed apart from its ticks: a tick may run a
        # step longer than the lease (a split, a rollback).
        self.scheduler.add_job(self.owner.keep_term, "interval", id="owner-lease",
                               seconds=leases.renew_interval(self.settings.owner_lease_seconds),
                               **every)
        self.scheduler.add_job(self.pool.renew_leases, "interval", id="renew",
                               seconds=leases.renew_interval(self.settings.lease_seconds),
                               **every)
        self.scheduler.add_job(self.pool.expire_untrusted, "interval", id="watchdog",
                               seconds=min(1.0, self.settings.lease_seconds / 6), **every)
        self.scheduler.start()
        self._owner_thread.start()
        self.listener.start()
        self.pool.start()
        log.info("node %s started with %d slots", self.node_id, self.slots)

    def drain(self, timeout: float = 60.0) -> None:
        """Graceful stop (SIGTERM)."""
        log.info("node %s draining", self.node_id)
        try:
            with self.worker_db.begin() as conn:
                nodes.set_draining(self.worker_db, conn, self.node_id)
        except Exception as exc:
            log.warning("could not mark node draining: %s", one_line(exc))
        self.pool.drain(timeout)
        self._owner_stop.set()
        self._owner_woken.set()
        if self._owner_thread.is_alive():
            self._owner_thread.join()
        self.scheduler.shutdown(wait=True)
        self.listener.stop()
        try:
            self.owner.resign()
            with self.worker_db.begin() as conn:
                subtasks.release_all_held_by(self.worker_db, conn, self.node_id)
                nodes.deregister(self.worker_db, conn, self.node_id)
        except Exception as exc:
            log.warning("could not deregister cleanly: %s", one_line(exc))
        self.worker_db.dispose()
        self.owner_db.dispose()
        with self._health_lock:
            self._health_db.dispose()
        self.reports.report(is_owner=False)
        self.stopped.set()
        log.info("node %s stopped", self.node_id)

    def _heartbeat(self) -> None:
        try:
            with self.worker_db.begin() as conn:
                if not nodes.heartbeat(self.worker_db, conn, self.node_id):
                    nodes.register(self.worker_db, conn, node_id=self.node_id,
                                   host=socket.gethostname(), pid=os.getpid(),
                                   version=reorg_version(), slots=self.slots)
                # The worker series of jobs that ended a while ago go: a
                # long-lived node keeps none of old jobs.
                shown = metrics.worker_jobs()
                ended = jobs.ended_before(self.worker_db, conn, shown,
                                          metrics.KEEP_ENDED_SECONDS) if shown else []
            metrics.forget_worker_jobs(ended)
        except Exception as exc:
            log.warning("heartbeat failed: %s", one_line(exc))
        metrics.drop_stale_replica_lag(metrics.KEEP_ENDED_SECONDS)

    def health(self) -> tuple[bool, dict[str, object]]:
        """What /healthz answers: healthy while the database answers and this
        node's heartbeat is fresh (younger than three heartbeat intervals:
        it missed two in a row; never later than the owner would declare the
        node dead)."""
        limit = min(3 * self.settings.heartbeat_seconds, self.settings.node_dead_after_seconds)
        body: dict[str, object] = {"node": self.node_id}
        if self.stopped.is_set():
            return False, {**body, "status": "unhealthy", "reason": "the node has stopped"}
        try:
            with self._health_lock, self._health_db.begin() as conn:
                row = nodes.heartbeat_of(self._health_db, conn, self.node_id)
        except Exception as exc:
            return False, {**body, "status": "unhealthy",
                           "reason": f"database unreachable: {one_line(exc)}"}
        if row is None:
            return False, {**body, "status": "unhealthy",
                           "reason": "the node is not registered (drained, or removed)"}
        age = round(float(row["heartbeat_age"]), 1)
        body.update(state=row["state"], heartbeat_age_seconds=age,
                    owner=self.owner.trusted(), subtasks_running=self.pool.busy())
        if age > limit:
            return False, {**body, "status": "unhealthy",
                           "reason": f"heartbeat is {age:g}s old (limit {limit:g}s): the "
                                     "node's scheduler is stuck or its writes fail"}
        return True, {"status": "ok", **body}

    def _owner_loop(self) -> None:
        while not self._owner_stop.is_set():
            self._owner_woken.clear()
            if not self._owner_tick():  # else a split's next chunk: at once
                self._owner_woken.wait(self.owner_tick_seconds)

    def _owner_tick(self) -> bool:
        """One tick; True when it left work the next tick should do at once."""
        try:
            result = self.owner.tick()
        except Exception as exc:
            log.warning("owner tick failed: %s", one_line(exc), exc_info=exc)
            return False
        for action in result.actions:
            log.info("owner rev %s: %s", result.revision, action)
        if not result.again:  # the figures once the chunks of a split are in
            # The owner's job metrics and progress lines (framework.job_reports).
            self.reports.report(result.is_owner)
        return result.again

    def _on_notify(self) -> None:
        self.pool.wake()
        # A job state change may concern a running subtask (cancel, pause) or
        # the owner (new job, resume): act now instead of at the next interval.
        self._owner_woken.set()
        renew = self.scheduler.get_job("renew")
        if renew is not None:
            renew.modify(next_run_time=datetime.now(UTC))
