"""Global options, and the Settings and Database built from them once per run.

The database URL is resolved lazily: ``reorg --help`` and usage errors never
start the embedded server, and nothing connects before a command needs to.
Commands that run nothing but the store's own statements on the system
tables (``reorg status``, ``wait``, ``cancel``, ``alter``) run them through
psycopg alone (``direct_database``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from framework import migrate, revisions
from framework.config import ConfigError, Settings
from framework.db import Database, SchemaBehind

if TYPE_CHECKING:
    from framework.directdb import DirectDatabase


@dataclass(frozen=True)
class GlobalOptions:
    db_url: str | None
    schema: str
    lease_seconds: float
    owner_lease_seconds: float
    max_attempts: int
    debug: bool


@dataclass
class CliState:
    """What every command reaches through ``ctx.obj``."""

    options: GlobalOptions
    embedded: bool = False
    _settings: Settings | None = None
    _db: Database | None = None
    _checked: bool = False
    _direct: DirectDatabase | None = None

    def settings(self) -> Settings:
        if self._settings is None:
            o = self.options
            # Validate the options before resolving the URL, so a bad option
            # does not start the embedded server first.
            unresolved = Settings("", schema=o.schema, lease_seconds=o.lease_seconds,
                                  owner_lease_seconds=o.owner_lease_seconds,
                                  max_attempts=o.max_attempts)
            self._settings = dataclasses.replace(unresolved, database_url=self._database_url())
        return self._settings

    def database(self) -> Database:
        """The system tables, checked to be at the revision this code needs.
        The embedded default is upgraded instead: there is nothing to set up."""
        db = self.unchecked_database()
        if not self._checked:
            if self.embedded:
                upgrade_if_behind(db)
            else:
                db.check_schema_current()
            self._checked = True
        return db

    def direct_database(self) -> DirectDatabase:
        """The system tables for a command that runs only the store's own
        statements: one psycopg connection, no SQLAlchemy engine
        (``framework.directdb``), checked to be at this code's revision like
        ``database``'s."""
        if self._direct is None:
            from framework.directdb import DirectDatabase

            direct = DirectDatabase(self.settings())
            try:
                direct.check_schema_current()
            except SchemaBehind:
                if not self.embedded:
                    direct.dispose()
                    raise
                self.database()  # the embedded default is upgraded instead
            self._direct = direct
        return self._direct

    def unchecked_database(self) -> Database:
        if self._db is None:
            self._db = Database(self.settings())
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
        if self._direct is not None:
            self._direct.dispose()
        self._db, self._checked, self._direct = None, False, None

    def _database_url(self) -> str:
        if self.options.db_url:
            return self.options.db_url
        from framework.localpg.embedded import embedded_database_url

        self.embedded = True
        try:
            return embedded_database_url()
        except ValueError as exc:  # e.g. a malformed REORG_EMBEDDED_PORT
            raise ConfigError(str(exc)) from None


def upgrade_if_behind(db: Database) -> None:
    """Upgrade unless current (``migrate.upgrade`` serialises concurrent runs)."""
    if db.check_schema_not_newer() != revisions.head_revision():
        migrate.upgrade(db)


def cli_state(ctx: typer.Context) -> CliState:
    """The state the global options callback put on the root context."""
    state = ctx.find_object(CliState)
    if state is None:  # only when a command is invoked without the root app
        raise RuntimeError("reorg's global options were not parsed")
    return state
