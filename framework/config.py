"""Settings shared by every reorg process, validated once.

The framework only sees this dataclass; the CLI fills it. These fields are
options, each also a ``REORG_*`` environment variable: ``database_url``
(``--db``), ``schema``, ``lease_seconds``, ``owner_lease_seconds`` and
``max_attempts`` (global options), and ``poll_seconds`` (``reorg worker
--poll-seconds``). The others keep their defaults under the CLI; only code
that builds Settings itself (tests, embedding programs) changes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class ConfigError(ValueError):
    """A setting is invalid; the message says which and how to fix it."""


@dataclass(frozen=True)
class Settings:
    # postgresql:// URL of the database holding the system tables.
    database_url: str
    # PostgreSQL schema of the system tables.
    schema: str = "reorg"
    # How long a worker's claim on a subtask lasts without renewal (seconds).
    lease_seconds: float = 30.0
    # How long the owner's term lasts without renewal (seconds).
    owner_lease_seconds: float = 15.0
    # How often an idle worker polls when no NOTIFY arrives (seconds).
    poll_seconds: float = 1.0
    # How often a node writes its heartbeat (seconds).
    heartbeat_seconds: float = 5.0
    # A node whose heartbeat is older than this is marked dead (seconds).
    node_dead_after_seconds: float = 60.0
    # Attempts per subtask before it fails for good.
    max_attempts: int = 5
    # First retry backoff (seconds); doubles per attempt, capped at 60 s.
    retry_backoff_seconds: float = 1.0
    # Jobs with fewer subtasks than this run only on the owner's node.
    local_job_max_subtasks: int = 4
    # Finished subtasks moved to history per owner transaction.
    history_batch: int = 1000
    # History rows older than this are deleted (days).
    history_retention_days: float = 30.0

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.schema):
            raise ConfigError(
                f"schema {self.schema!r} is not a plain lower-case identifier; "
                "use letters, digits and underscores, e.g. --schema reorg"
            )
        if self.lease_seconds < 1:
            raise ConfigError("lease length must be at least 1 second; raise --lease-seconds")
        if self.owner_lease_seconds < 1:
            raise ConfigError(
                "owner lease must be at least 1 second; raise --owner-lease-seconds"
            )
        if self.max_attempts < 1:
            raise ConfigError("max attempts must be at least 1; raise --max-attempts")
