"""The single owner lease row: campaign, renew, resign, and the owner fence.

The term of an owner is ``(owner_id, revision)``. The revision increases on
every change of owner, so a deposed owner (paused, partitioned) can be told
apart from its successor even if it comes back with the same id::

    node A  ──campaign──► rev 7 ──renew──renew──X (paused)
    node B                          ...lease expires... ──campaign──► rev 8
    node A  (wakes) write fenced on rev 7 ──► 0 rows

Every owner write embeds ``FENCE``, which takes a KEY SHARE lock on the lease
row, and ``campaign`` locks the row FOR UPDATE, which conflicts with it: a new
term cannot begin while a fenced write of the old one is in flight, and once
it has begun every write of the old term finds no row. ``renew`` is a plain
UPDATE of non-key columns, which KEY SHARE lets through: the owner keeps its
term alive while one of its own long steps (a split, a rollback, DDL waiting
for a lock) holds the fence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework.db import Database, SqlConnection, SqlDatabase
from framework.states import JOB_TERMINAL, JobState

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

FENCE = """EXISTS (
    SELECT 1 FROM {s}.owner_lease ol
    WHERE ol.id = 1 AND ol.owner_id = :owner_id AND ol.revision = :owner_revision
      AND ol.expires_at > clock_timestamp()
    FOR KEY SHARE)"""


# Jobs no owner drives yet (queued) or any more (ended): no owner change to note.
_NOT_DRIVEN = ", ".join(f"'{s}'" for s in sorted({*JOB_TERMINAL, JobState.QUEUED}))


@dataclass(frozen=True)
class OwnerTerm:
    owner_id: str
    revision: int

    def params(self) -> dict[str, object]:
        return {"owner_id": self.owner_id, "owner_revision": self.revision}


def campaign(db: Database, conn: Connection, node_id: str) -> OwnerTerm | None:
    """Take the lease if it is free or expired; a new term gets a new revision.

    FOR UPDATE waits for no one: while any fenced owner transaction is in
    flight (it holds KEY SHARE) the row is skipped and nobody is elected.

    A term that follows another's records the change of owner in the events
    of every job that owner was driving (started and not ended), in the same
    statement; the very first term, or one after a fresh install, has none
    to note."""
    revision = conn.execute(
        db.sql(f"""
            WITH free AS (
                SELECT id, owner_id AS before_id, revision AS before_revision
                FROM {{s}}.owner_lease
                WHERE id = 1 AND expires_at <= clock_timestamp()
                FOR UPDATE SKIP LOCKED),
            elected AS (
                UPDATE {{s}}.owner_lease ol
                SET owner_id = :node_id, revision = ol.revision + 1,
                    elected_at = clock_timestamp(),
                    expires_at = clock_timestamp() + make_interval(secs => :ttl)
                FROM free WHERE ol.id = free.id
                RETURNING ol.revision, free.before_id, free.before_revision),
            noted AS (
                INSERT INTO {{s}}.job_events (job_id, actor, from_state, to_state, detail)
                SELECT j.id, 'owner ' || :node_id || ' rev ' || e.revision, j.state, j.state,
                       'owner changed: ' || :node_id || ' (rev ' || e.revision
                       || ') took over from ' || e.before_id || ' (rev ' || e.before_revision
                       || '), whose term had ended'
                FROM elected e JOIN {{s}}.jobs j ON j.state NOT IN ({_NOT_DRIVEN})
                WHERE e.before_id IS NOT NULL)
            SELECT revision FROM elected"""),
        {"node_id": node_id, "ttl": db.settings.owner_lease_seconds},
    ).scalar()
    return OwnerTerm(node_id, revision) if revision is not None else None


def renew(db: Database, conn: Connection, term: OwnerTerm) -> bool:
    """Extend the current term; False means it is over (expired or taken)."""
    row = conn.execute(
        db.sql("""
            UPDATE {s}.owner_lease
            SET expires_at = clock_timestamp() + make_interval(secs => :ttl)
            WHERE id = 1 AND owner_id = :owner_id AND revision = :owner_revision
              AND expires_at > clock_timestamp()
            RETURNING revision"""),
        {**term.params(), "ttl": db.settings.owner_lease_seconds},
    ).first()
    return row is not None


def resign(db: Database, conn: Connection, term: OwnerTerm) -> bool:
    """End the term now so another node can take over without waiting."""
    row = conn.execute(
        db.sql("""
            UPDATE {s}.owner_lease SET expires_at = clock_timestamp()
            WHERE id = 1 AND owner_id = :owner_id AND revision = :owner_revision
            RETURNING revision"""),
        term.params(),
    ).first()
    return row is not None


def hold(db: Database, conn: Connection, term: OwnerTerm, *, durable: bool = True) -> bool:
    """Check the term at the start of a multi-statement owner transaction and
    keep the lease row KEY SHARE locked until it commits: no new term can begin
    while this transaction's DDL and writes are in flight.

    ``durable=False``: the commit does not wait for its WAL to reach disk
    (``synchronous_commit`` off for this transaction only), for the owner's
    bookkeeping that a later tick redoes if a server crash loses it. It stays
    atomic, and any durable commit after it flushes it too (WAL is written
    in order), so nothing that depends on it can outlive it."""
    if durable:
        return conn.execute(db.sql(f"SELECT {FENCE}"), term.params()).scalar() is True
    return conn.execute(
        db.sql(f"SELECT {FENCE}, set_config('synchronous_commit', 'off', true)"),
        term.params()).scalar() is True


def current(db: SqlDatabase, conn: SqlConnection) -> dict[str, object]:
    row = conn.execute(
        db.sql("""
            SELECT owner_id, revision, elected_at, expires_at,
                   expires_at > clock_timestamp() AS live
            FROM {s}.owner_lease WHERE id = 1""")
    ).mappings().one()
    return dict(row)
