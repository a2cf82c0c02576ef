"""Pause, resume, cancel, retry and alter from the page: allowed only with
the token the dashboard was started with, run through ``framework.control``
as the ``reorg`` commands of the same names, and recorded in the job's events
with the actor ``dashboard:<client address>``."""

from __future__ import annotations

import hmac
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from framework import control
from framework.db import Database
from framework.errors import InvalidParams

# The buttons: each returns the line the page shows.
ACTIONS: dict[str, Callable[[Database, int, str], str]] = {
    "pause": lambda db, job_id, who:
        f"job {job_id}: pause requested, now {control.pause(db, job_id, actor=who)}",
    "resume": lambda db, job_id, who:
        f"job {job_id}: resume requested, now {control.resume(db, job_id, actor=who)}",
    "cancel": lambda db, job_id, who:
        f"job {job_id}: cancel requested, now {control.cancel(db, job_id, actor=who)}",
    "retry": lambda db, job_id, who:
        f"job {job_id}: {control.retry(db, job_id, actor=who)} failed subtasks re-queued; "
        "resuming",
}

# The alter form's fields: (name, its `reorg alter` option, number type).
# A field left empty keeps the job's value.
ALTER_FIELDS: tuple[tuple[str, str, type[int] | type[float]], ...] = (
    ("batch_rows", "--batch-rows", int),
    ("max_rows_per_sec", "--max-rows-per-sec", int),
    ("concurrency", "--concurrency", int),
    ("max_replica_lag", "--max-replica-lag", float),
    ("max_active_sessions", "--max-active-sessions", int),
)

READ_ONLY = ("this dashboard is read-only: start it with --token or REORG_DASHBOARD_TOKEN "
             "to pause, resume, cancel, retry or alter jobs")


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
            raise Refused("refused: enter the dashboard's token to pause, resume, cancel, "
                          "retry or alter; nothing was changed")
        # Constant time: the answer must not tell how much of a guess was right.
        if not hmac.compare_digest(given.encode(), self.value.encode()):
            raise Refused("refused: wrong token; nothing was changed")


def actor(client_host: str | None) -> str:
    """Who job events name for a request from ``client_host``."""
    return f"dashboard:{client_host or 'unknown'}"


def run(db: Database, name: str, job_id: int, *, who: str) -> str:
    """Run the button ``name`` on the job; InvalidParams (one line) when the
    job's state refuses it, as ``reorg pause`` etc. would."""
    return ACTIONS[name](db, job_id, who)


def parse_alter(form: Mapping[str, str]) -> dict[str, Any]:
    """The alter form's filled-in fields as ``control.alter``'s arguments;
    InvalidParams naming the first field that is not a number, or none filled."""
    values: dict[str, Any] = {}
    for name, option, kind in ALTER_FIELDS:
        raw = form.get(name, "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            what = "a whole number" if kind is int else "a number of seconds"
            raise InvalidParams(f"{option} must be {what}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidParams(f"{option} must be a number of seconds, got {raw!r}")
        values[name] = value
    if not values:
        raise InvalidParams("nothing to change: fill in at least one of batch rows, max rows/s, "
                            "concurrency, max replica lag or max active sessions")
    return values


def alter(db: Database, job_id: int, form: Mapping[str, str], *, who: str) -> str:
    """``reorg alter`` from the form: the line the page shows; InvalidParams
    (nothing changed) for bad input or a job that cannot be altered."""
    changed = control.alter(db, job_id, **parse_alter(form), actor=who)
    return f"job {job_id} altered: {changed}"
