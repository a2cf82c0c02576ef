"""A PostgreSQL cluster run from local server binaries (no Docker needed).

Used for the embedded default database (see ``framework.localpg.embedded``) and as the
test server when no Docker engine is available.

Layout of ``data_dir``::

    pgdata/        the cluster (initdb's data directory)
    run/           unix socket directory
    postgres.log   server log (pg_ctl -l)

PostgreSQL refuses to run as root, so when we are root every binary runs as an
unprivileged user through ``runuser`` and ``data_dir`` is handed to that user.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

DEBIAN_PG_ROOT = Path("/usr/lib/postgresql")
# Names a bin dir to use before any other (e.g. another major's, installed by
# tests/support/pg_major.py): the tests' server and the embedded database use it.
BINDIR_ENV = "REORG_PG_BINDIR"
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
FALLBACK_USER = "reorg-pg"
# Linux limits a unix socket path (sun_path) to 107 bytes; leave room for ".s.PGSQL.NNNNN".
_MAX_SOCKET_DIR_LEN = 90


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


class PostgresError(RuntimeError):
    """A PostgreSQL binary failed; the message carries its output."""


def find_binaries() -> Path:
    """Return the directory holding initdb, pg_ctl and postgres.

    Order: ``$REORG_PG_BINDIR`` when set (and then only it: a wrong path is an
    error, not a silent fall back to another major), ``initdb`` on PATH, the
    newest ``/usr/lib/postgresql/*/bin`` (Debian keeps the server binaries off
    PATH), then the bundle of a pip-installed ``pgserver``.
    """
    override = os.environ.get(BINDIR_ENV)
    if override:
        bindir = Path(override)
        missing = [name for name in _SERVER_BINARIES if not (bindir / name).is_file()]
        if missing:
            raise PostgresNotFound(
                f"{BINDIR_ENV}={override} has no {', '.join(missing)}: point it at the bin "
                "directory of a PostgreSQL server install, or unset it"
            )
        return bindir
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        # Resolve symlinks (e.g. /usr/local/bin/initdb): pg_ctl and postgres live
        # next to the real file, not necessarily next to the link.
        candidates.append(Path(on_path).resolve().parent)
    debian = sorted(
        glob.glob(str(DEBIAN_PG_ROOT / "*" / "bin")),
        key=lambda p: _version_key(Path(p).parent.name),
        reverse=True,
    )
    candidates.extend(Path(p) for p in debian)
    bundled = _pgserver_bindir()
    if bundled is not None:
        candidates.append(bundled)
    for bindir in candidates:
        if all((bindir / name).is_file() for name in _SERVER_BINARIES):
            return bindir
    raise PostgresNotFound(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install them with "
        "`apt-get install postgresql` or `pip install pgserver`, "
        "or configure an external database URL."
    )


def binaries_version(bindir: Path) -> str:
    """The PostgreSQL version of the server binaries in ``bindir``, e.g. ``"16.4"``."""
    result = subprocess.run(
        [str(bindir / "postgres"), "--version"], stdin=subprocess.DEVNULL,
        capture_output=True, text=True,
    )  # fmt: skip
    # "postgres (PostgreSQL) 16.4" (some builds append a vendor note in parentheses).
    words = result.stdout.split(")", 1)[-1].split()
    if result.returncode != 0 or not words:
        raise PostgresError(f"{bindir / 'postgres'} --version failed: {result.stderr.strip()}")
    return words[0]


def _version_key(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in name.split("."))
    except ValueError:
        return (-1,)


def _pgserver_bindir() -> Path | None:
    # find_spec locates the package without importing (and starting) anything.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when a server could listen on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same option postgres sets, so a port only in TIME_WAIT counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def accepts_tcp(port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _quote_conf(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class LocalPostgres:
    """One PostgreSQL cluster in ``data_dir``, listening on 127.0.0.1 only.

    Construction is cheap (no subprocess, no binary lookup) so callers can build
    one just to ask ``is_running()``.
    """

    def __init__(self, data_dir: Path, port: int | None = None, *, durable: bool = True) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port if port is not None else free_port()
        self.durable = durable
        self.pgdata = self.data_dir / "pgdata"
        self.socket_dir = self.data_dir / "run"
        self.log_file = self.data_dir / "postgres.log"
        self._bindir: Path | None = None

    # -- public API -----------------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def is_initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").is_file()

    def init(self) -> None:
        """Create the cluster (initdb) and configure it; fails if it already exists."""
        if self.is_initialized():
            raise PostgresError(f"a PostgreSQL cluster already exists in {self.pgdata}")
        user = _server_user()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if user is not None:
            for path in (self.data_dir, self.socket_dir):
                shutil.chown(path, user, user)
            self._check_reachable(user)
        if self.pgdata.exists():
            # Left over from an initdb that was interrupted; initdb wants it empty.
            shutil.rmtree(self.pgdata)
        self._run(
            "initdb",
            "-D", str(self.pgdata),
            "-U", "postgres",
            "--encoding=UTF8",
            # C collation: byte-order key ranges, identical on every machine.
            "--locale=C",
            "--auth=trust",
        )  # fmt: skip
        self._write_config()

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run(
            "pg_ctl",
            "-D", str(self.pgdata),
            "-l", str(self.log_file),
            "-o", f"-p {int(self.port)}",
            "-w", "-t", "60",
            "start",
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the server (fast shutdown); a no-op when it is not running."""
        if not self.is_running():
            return
        self._run("pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60", "stop")

    def is_running(self) -> bool:
        return self.running_port() is not None

    def running_port(self) -> int | None:
        """Port of the live postmaster of this cluster, read from postmaster.pid.

        No subprocess: this is on the fast path of ``embedded_database_url``.
        """
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # stale file left by a crash
        except PermissionError:
            pass  # alive, owned by the server user
        return port

    def create_database(self, name: str) -> None:
        """Create database ``name`` unless it exists."""
        import psycopg
        from psycopg import errors, sql

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                return
            # Created concurrently by someone else between the check and here: fine.
            with contextlib.suppress(errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    # -- internals ------------------------------------------------------------

    def _write_config(self) -> None:
        # Trust is safe only because nothing but this host can connect: the
        # server listens on 127.0.0.1 and the socket dir is private to its owner.
        hba = "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        (self.pgdata / "pg_hba.conf").write_text(hba)
        socket_dir = str(self.socket_dir)
        settings = {
            "listen_addresses": _quote_conf("127.0.0.1"),
            # An over-long socket path would stop the server from starting; we
            # only use TCP ourselves, so drop the socket rather than fail.
            "unix_socket_directories": _quote_conf(
                socket_dir if len(socket_dir) <= _MAX_SOCKET_DIR_LEN else ""
            ),
            # Worker pools, owner and tests each hold several connections.
            "max_connections": "300",
        }
        if not self.durable:
            # Throwaway test clusters: speed over crash safety.
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        block = "\n# added by reorg (framework/localpg/cluster.py)\n" + "".join(
            f"{key} = {value}\n" for key, value in settings.items()
        )
        # Appending keeps the file's owner; later lines override initdb's defaults.
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write(block)

    def _check_reachable(self, user: str) -> None:
        probe = subprocess.run(
            ["runuser", "-u", user, "--", "test", "-w", str(self.data_dir)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        if probe.returncode != 0:
            raise PostgresError(
                f"user {user!r} cannot write {self.data_dir}: choose a directory whose "
                "parents it can traverse (e.g. under /tmp or /var/lib, not /root)"
            )

    def _run(self, binary: str, *args: str) -> None:
        if self._bindir is None:
            self._bindir = find_binaries()
        cmd = [str(self._bindir / binary), *args]
        user = _server_user()
        if user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        # cwd: the server user may not be allowed into the caller's cwd (e.g. /root).
        # stdin closed so a daemonised postmaster never holds our terminal.
        result = subprocess.run(
            cmd,
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise PostgresError(
                f"{binary} failed (exit {result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- {self.log_file} (last {len(tail)} lines) ---\n" + "\n".join(tail)


def _server_user() -> str | None:
    """The user to run binaries as, or None to run them as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", FALLBACK_USER):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    result = subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home",
         "--shell", "/usr/sbin/nologin", FALLBACK_USER],
        capture_output=True,
        text=True,
    )  # fmt: skip
    try:
        pwd.getpwnam(FALLBACK_USER)  # may also have been created concurrently
    except KeyError:
        raise PostgresError(f"could not create user {FALLBACK_USER}: {result.stderr}") from None
    return FALLBACK_USER
