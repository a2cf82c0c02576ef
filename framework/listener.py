"""LISTEN/NOTIFY wake-ups, so an idle node reacts to new work or a job state
change in well under a second; the pollers remain as a fallback when a
notification is missed (e.g. while the listener reconnects)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from framework.errors import one_line

log = logging.getLogger("reorg.listener")


class Listener(threading.Thread):
    def __init__(self, url: str, channel: str, on_notify: Callable[[], None]) -> None:
        super().__init__(name="listener", daemon=True)
        self.url, self.channel, self.on_notify = url, channel, on_notify
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                # Named like reorg's other sessions (framework.db), so operators
                # see it as reorg's and the load signal leaves it out.
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5,
                                     application_name="reorg-listener") as conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    while not self._stopping.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self.on_notify()
            except Exception as exc:
                log.warning("listener reconnecting: %s", one_line(exc))
                self._stopping.wait(1.0)

    def stop(self) -> None:
        self._stopping.set()
