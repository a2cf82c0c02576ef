"""The embedded default database, used when the user configures none.

The first call initialises a durable cluster under the user's data directory;
later calls start it if needed. The server keeps running after the command exits
(like a daemon) so the next ``reorg`` command finds it with one TCP connect.

Environment:
  REORG_EMBEDDED_DIR   where the cluster lives (default: see ``embedded_dir``)
  REORG_EMBEDDED_PORT  preferred port when the server starts (default 54329)
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from framework.localpg.cluster import LocalPostgres, accepts_tcp, free_port, port_is_free

DEFAULT_PORT = 54329
DATABASE = "reorg"
PORT_FILE = "port"  # port of the last successful start; also marks "database created"
LOCK_FILE = "lock"


def embedded_dir() -> Path:
    override = os.environ.get("REORG_EMBEDDED_DIR")
    if override:
        return Path(override).expanduser().absolute()
    if os.geteuid() == 0:
        # The server runs as an unprivileged user who cannot traverse /root.
        return Path("/var/lib/reorg/postgres")
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "reorg" / "postgres"


def embedded_database_url() -> str:
    """URL of the embedded ``reorg`` database; initialises/starts the cluster if needed."""
    data_dir = embedded_dir()
    url = _url_if_running(data_dir)
    if url is not None:
        return url
    with _locked(data_dir):
        # Another process may have finished the work while we waited for the lock.
        url = _url_if_running(data_dir)
        if url is not None:
            return url
        pg = LocalPostgres(data_dir, _choose_port(data_dir), durable=True)
        if not pg.is_initialized():
            pg.init()
        running_port = pg.running_port()
        if running_port is None:
            pg.start()
        else:
            pg.port = running_port  # up, but setup was interrupted before the port file
        pg.create_database(DATABASE)
        _write_port(data_dir, pg.port)
        return pg.url(DATABASE)


def stop_embedded() -> bool:
    """Stop the embedded server if it runs; its data stays. True when it was running."""
    data_dir = embedded_dir()
    if not data_dir.is_dir():
        return False
    with _locked(data_dir):
        pg = LocalPostgres(data_dir, _read_port(data_dir) or DEFAULT_PORT)
        was_running = pg.is_running()
        pg.stop()
        return was_running


def _url_if_running(data_dir: Path) -> str | None:
    """Fast path: no subprocess, no lock; only file reads and one TCP connect."""
    port = _read_port(data_dir)
    if port is None:
        return None
    pg = LocalPostgres(data_dir, port)
    # Our own postmaster must be the one on that port, not some other server.
    if pg.running_port() != port or not accepts_tcp(port):
        return None
    return pg.url(DATABASE)


def _choose_port(data_dir: Path) -> int:
    preferred = os.environ.get("REORG_EMBEDDED_PORT")
    if preferred and not preferred.isdigit():
        raise ValueError(f"REORG_EMBEDDED_PORT must be a TCP port number, got {preferred!r}")
    remembered = _read_port(data_dir)
    candidates = [int(preferred), remembered] if preferred else [remembered, DEFAULT_PORT]
    # Only called while our server is down, so anyone on these ports is a stranger.
    for port in candidates:
        if port is not None and port_is_free(port):
            return port
    return free_port()


def _read_port(data_dir: Path) -> int | None:
    try:
        return int((data_dir / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _write_port(data_dir: Path, port: int) -> None:
    tmp = data_dir / f"{PORT_FILE}.tmp"
    tmp.write_text(f"{port}\n")
    tmp.replace(data_dir / PORT_FILE)  # atomic: readers never see a half-written file


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise init/start/stop across processes (released if we die)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
