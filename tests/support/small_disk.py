"""A small disk for PostgreSQL to run out of: a tmpfs of a few MiB mounted
under /tmp (root only), handed to the server's user and made a tablespace, so
a test can put a table on it, fill the rest with a file and see the server's
writes fail with ``could not extend file ...: No space left on device``
(SQLSTATE 53100) while everything else of the server (WAL, catalogue, the
system tables) has room. ``small_disk`` is the pytest fixture; it skips with
the reason when it cannot mount or the server is not on this machine."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

SIZE = "8m"
_CHUNK = b"\0" * 65_536


@dataclass
class SmallDisk:
    path: Path
    tablespace: str
    url: str  # the test's database

    def take(self, table: str) -> None:
        """Move ``table`` (its heap; indexes stay) onto the small disk."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER TABLE {} SET TABLESPACE {}").format(
                sql.Identifier(table), sql.Identifier(self.tablespace)))
            # Its free-space and visibility maps exist before the disk is full.
            conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(table)))

    @property
    def filler(self) -> Path:
        return self.path / "filler"

    def fill(self) -> None:
        """Write a file until the disk has not one byte left."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                os.write(fd, _CHUNK)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        assert self.free_bytes() == 0, self.free_bytes()

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize


def _server_data_directory(admin_url: str) -> Path | None:
    with psycopg.connect(admin_url) as conn:
        path = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    # A server in a container names a path of its own, not this machine's.
    return path if (path / "postmaster.pid").is_file() else None


@pytest.fixture
def small_disk(pg_server: str, migrated_db: str, workers) -> Iterator[SmallDisk]:
    """A tablespace on an 8 MiB tmpfs. Its finalizer stops the test's workers,
    drops what the test put there, the tablespace, and unmounts."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a small tmpfs to fill")
    data_dir = _server_data_directory(pg_server)
    if data_dir is None:
        pytest.skip("PostgreSQL is not running on this machine: its tablespace must be here")
    path = Path(tempfile.mkdtemp(prefix="reorg-disk-", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        path.rmdir()
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    owner = data_dir.stat()
    os.chown(path, owner.st_uid, owner.st_gid)
    disk = SmallDisk(path, f"reorg_small_{uuid.uuid4().hex[:8]}", migrated_db)
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE TABLESPACE {} LOCATION {}").format(
                sql.Identifier(disk.tablespace), sql.Literal(str(path))))
        yield disk
    finally:
        workers.stop_all()  # nothing may hold the tables on the disk
        disk.free()
        with contextlib.suppress(psycopg.Error), \
                psycopg.connect(migrated_db, autocommit=True) as conn:
            for (name,) in conn.execute(
                    "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_tablespace t "
                    "ON t.oid = c.reltablespace WHERE t.spcname = %s AND c.relkind = 'r'",
                    (disk.tablespace,)).fetchall():
                conn.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        with contextlib.suppress(psycopg.Error), \
                psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLESPACE IF EXISTS {}").format(
                sql.Identifier(disk.tablespace)))
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)  # still busy
        shutil.rmtree(path, ignore_errors=True)
