"""Lease arithmetic, kept pure so it can be unit-tested.

A lease of length ``ttl`` is renewed every ``ttl / 3``: two renewals can fail
(a slow statement, a brief network blip) before the lease runs out. The holder
trusts its lease only for ``ttl - margin`` after the last successful renewal,
measured on its own monotonic clock from before the renewal was sent, so a
stale holder stops acting before the database lets anyone else take over::

    renew sent ─┬─────────── trust window (ttl - margin) ───────────┐
                └───────────────── lease (ttl, db clock) ─────────────────┐
                                                      holder stops ┘       └ others may claim
"""

from __future__ import annotations

import random


def renew_interval(ttl: float) -> float:
    return ttl / 3


def trust_window(ttl: float) -> float:
    """How long after sending a successful renewal the holder may act."""
    return ttl - max(ttl / 6, 0.5)


def still_trusted(renewed_at: float, now: float, ttl: float) -> bool:
    return now - renewed_at < trust_window(ttl)


def retry_backoff(attempt: int, base: float, cap: float = 60.0, jitter: float = 0.2) -> float:
    """Exponential backoff with jitter for retryable subtask errors: attempt 1
    waits ``base``, each later one twice as long, never more than ``cap``."""
    delay = min(cap, base * 2 ** max(attempt - 1, 0))
    return delay * (1 + random.uniform(-jitter, jitter))
