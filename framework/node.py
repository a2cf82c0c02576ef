"""One reorg node: a worker pool plus a candidate for owner, on one schedule.

``reorg worker`` runs exactly this. The APScheduler loop runs five jobs:
heartbeat, owner tick (campaign, then duties while elected), owner lease
renewal (every owner ttl/3, apart from the ticks), worker lease renewal (every
ttl/3, on its own connection) and the lease watchdog. SIGTERM drains: stop claiming, let the
current batches commit, release leases at once, resign ownership, deregister.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from apscheduler.schedulers.background import BackgroundScheduler

from framework import leases, metrics
from framework.config import Settings
from framework.db import Database
from framework.errors import one_line
from framework.listener import Listener
from framework.owner import Owner
from framework.store import jobs, nodes, progress, subtasks
from framework.worker import WorkerPool

log = logging.getLogger("reorg.node")


def default_node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def reorg_version() -> str:
    try:
        return version("reorg")
    except PackageNotFoundError:
        return "dev"


class Node:
    def __init__(self, settings: Settings, *, node_id: str | None = None, slots: int = 2,
                 owner_tick_seconds: float = 1.0) -> None:
        self.settings = settings
        self.node_id = node_id or default_node_id()
        self.slots = slots
        self.worker_db = Database(settings, role="worker", pool_size=slots + 2)
        self.owner_db = Database(settings, role="owner", pool_size=3)
        self.pool = WorkerPool(self.worker_db, self.node_id, slots)
        self.owner = Owner(self.owner_db, self.node_id)
        self.owner_tick_seconds = owner_tick_seconds
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self.listener = Listener(settings.database_url, jobs.channel(self.worker_db),
                                 self._on_notify)
        self.stopped = threading.Event()
        # Set while an owner tick runs: a wake-up then would only be skipped
        # (and logged) by the scheduler. The tick may have read the jobs
        # before the change, so every wake-up is also noted (``_owner_woken``)
        # and a tick during which one came runs again at once: a job submitted
        # meanwhile is not left for the next interval (a second, most of a
        # Spark submit's wait for the owner's verdict).
        self._owner_busy = threading.Event()
        self._owner_woken = threading.Event()

    def start(self) -> None:
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
        self.scheduler.add_job(self._owner_tick, "interval", id="owner",
                               seconds=self.owner_tick_seconds,
                               next_run_time=datetime.now(UTC), **every)
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
        metrics.owner_jobs(False, [])
        self.stopped.set()
        log.info("node %s stopped", self.node_id)

    def _heartbeat(self) -> None:
        try:
            with self.worker_db.begin() as conn:
                if not nodes.heartbeat(self.worker_db, conn, self.node_id):
                    nodes.register(self.worker_db, conn, node_id=self.node_id,
                                   host=socket.gethostname(), pid=os.getpid(),
                                   version=reorg_version(), slots=self.slots)
        except Exception as exc:
            log.warning("heartbeat failed: %s", one_line(exc))

    def _owner_tick(self) -> None:
        # Ends only with a tick no notification arrived during: each tick acts
        # on what changed, and a tick that changes nothing notifies nobody.
        while True:
            self._owner_woken.clear()
            self._owner_busy.set()
            try:
                self._owner_tick_once()
            finally:
                self._owner_busy.clear()
            if not self._owner_woken.is_set():
                return

    def _owner_tick_once(self) -> None:
        try:
            result = self.owner.tick()
        except Exception as exc:
            log.warning("owner tick failed: %s", one_line(exc), exc_info=exc)
            return
        for action in result.actions:
            log.info("owner rev %s: %s", result.revision, action)
        self._report_jobs(result.is_owner)

    def _report_jobs(self, is_owner: bool) -> None:
        """The owner's job gauges: one progress read of the live jobs (and of
        those that were live last time, for their final figures) a tick."""
        shown: list[dict] = []
        if is_owner:
            try:
                with self.owner_db.begin() as conn:
                    shown = progress.live_jobs_progress(self.owner_db, conn,
                                                        metrics.shown_live_jobs())
                    # The samples status's recent rows/s and ETA come from.
                    progress.record_samples(self.owner_db, conn, shown)
            except Exception as exc:  # only figures: the next tick tries again
                log.debug("job figures not read: %s", one_line(exc))
                return
        metrics.owner_jobs(is_owner, shown)

    def _on_notify(self) -> None:
        self.pool.wake()
        # A job state change may concern a running subtask (cancel, pause) or
        # the owner (new job, resume): act now instead of at the next interval.
        now = datetime.now(UTC)
        self._owner_woken.set()  # before reading busy: see _owner_tick
        for job_id in ("renew",) if self._owner_busy.is_set() else ("owner", "renew"):
            job = self.scheduler.get_job(job_id)
            if job is not None:
                job.modify(next_run_time=now)
