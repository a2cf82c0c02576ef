"""Pause, resume and cancel from the page: allowed only with the token the
dashboard was started with, and recorded in the job's events with the actor
``dashboard:<client address>``."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from framework import control
from framework.db import Database
from framework.states import JobState

ACTIONS: dict[str, Callable[..., JobState]] = {
    "pause": control.pause,
    "resume": control.resume,
    "cancel": control.cancel,
}

READ_ONLY = ("this dashboard is read-only: start it with --token or REORG_DASHBOARD_TOKEN "
             "to pause, resume or cancel jobs")


class Refused(Exception):
    """An action refused before it reached the job; its message is what the user sees."""


@dataclass(frozen=True)
class Token:
    """The token actions need; ``None``: the dashboard is read-only."""

    value: str | None

    @property
    def read_only(self) -> bool:
        return self.value is None

    def check(self, given: str | None) -> None:
        if self.value is None:
            raise Refused(READ_ONLY)
        if not given:
            raise Refused("refused: enter the dashboard's token to pause, resume or cancel")
        # Constant time: the answer must not tell how much of a guess was right.
        if not hmac.compare_digest(given.encode(), self.value.encode()):
            raise Refused("refused: wrong token; nothing was changed")


def actor(client_host: str | None) -> str:
    """Who job events name for a request from ``client_host``."""
    return f"dashboard:{client_host or 'unknown'}"


def run(db: Database, name: str, job_id: int, *, who: str) -> JobState:
    """Run the action ``name`` on the job; InvalidParams (one line) when the
    job's state refuses it, as ``reorg pause`` etc. would."""
    return ACTIONS[name](db, job_id, actor=who)
