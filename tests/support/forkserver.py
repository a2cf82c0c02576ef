"""``reorg`` commands and workers forked from a warm process instead of
started cold.

A ``reorg`` process spends most of its CPU importing typer, rich, SQLAlchemy
and psycopg (0.4-0.9 CPU-s a command, 1 CPU-s a worker); the suite runs
hundreds of them on two cores. Here a server process imports them once, then
forks a child per command. The child is still a process of its own: its own
stdin (``/dev/null``), stdout and stderr (pipes or a log file of the test),
environment, working directory, signals, exit code, and interpreter shutdown
(threads joined, ``atexit`` run); it runs ``cli.main.main`` as the installed
``reorg`` script, or ``python -m cli.main``, does.

What a fork does not reproduce, so the tests of it start real processes
(``subprocess``): what a command imports (``test_command_imports``), a
Ctrl-C during start-up (``test_cli_interrupts``), terminals and signals to a
command's process group (``cli_support.Running``), and what Python reads when
it starts: the ``PYTHON*`` variables, so there is one server per set of them
(a worker's PYTHONPATH has the tests' job types). ``TESTS_FORK_COMMANDS=0``
runs every command as a real process.

A server is started on first use and ends with the test process: it reads
its stdin, a pipe from the test process, and exits at EOF.

Protocol, over a ``SOCK_SEQPACKET`` Unix socket, a connection per command:
the test sends the request as JSON (argv, env, cwd) with the write ends of
its stdout and stderr pipes; the server's handler forks the command and
answers ``pid N``, then ``exit CODE`` (``subprocess``'s convention: ``-SIG``
for a signal).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ENABLED = os.environ.get("TESTS_FORK_COMMANDS", "1") != "0"
_MAX_REQUEST = 1 << 20


# -- the test's side -------------------------------------------------------------------


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="reorg-forkserver-")
        self.path = os.path.join(self.dir, "socket")
        self.log = os.path.join(self.dir, "server.log")
        # Nothing of one command's REORG_* (REORG_FAULTS arms fault points when
        # framework.faults is imported) may reach the others through the server.
        env = {k: v for k, v in env.items() if not k.startswith("REORG_")}
        with open(self.log, "wb") as log:
            # Its own session: a signal to the test's process group is not for it.
            self.proc = subprocess.Popen(
                [sys.executable, __file__, self.path], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
        atexit.register(self.stop)

    def wait_ready(self, timeout: float = 60) -> bool:
        """Until the server listens; False when it ended or never did."""
        ready = os.path.join(self.dir, "ready")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if os.path.exists(ready):
                return True
            time.sleep(0.02)
        return False

    def send(self, argv: list[str], env: dict[str, str], cwd: str,
             fds: list[int]) -> socket.socket:
        """The request of one command; the connection its pid and exit code come on."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(self.path)
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        socket.send_fds(conn, [request], fds)
        return conn

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# One server per start-up environment (the ``PYTHON*`` variables: a worker's
# PYTHONPATH has the tests' job types, a user's command's has not).
_servers: dict[frozenset[tuple[str, str]], _Server | None] = {}
_lock = threading.Lock()


def _startup_env(env: dict[str, str]) -> frozenset[tuple[str, str]]:
    """What Python reads from the environment when it starts."""
    return frozenset((k, v) for k, v in env.items() if k.startswith("PYTHON"))


def _server_for(argv: list[str], env: dict[str, str]) -> _Server | None:
    """The server that can fork ``argv`` (``reorg ...`` or ``python -m
    cli.main ...``), or None: run it as a real process."""
    if not ENABLED or not (os.path.basename(argv[0]) == "reorg"
                           or argv[:3] == [sys.executable, "-m", "cli.main"]):
        return None
    key = _startup_env(env)
    with _lock:
        if key not in _servers:
            server = _Server(env)
            if server.wait_ready():
                _servers[key] = server
            else:
                sys.stderr.write(f"forkserver did not start; real processes from now on:\n"
                                 f"{Path(server.log).read_text(errors='replace')}\n")
                server.stop()
                _servers[key] = None
        return _servers[key]


def server_pids() -> list[int]:
    """The pids of the servers running."""
    return [s.proc.pid for s in _servers.values() if s is not None]


def run(argv: list[str], *, env: dict[str, str], timeout: float,
        cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, stdin=DEVNULL,
    env=env, timeout=timeout, cwd=cwd)``, forked when it can be."""
    server = _server_for(argv, env)
    if server is None:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=cwd, stdin=subprocess.DEVNULL)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        conn = server.send(argv, env, cwd or os.getcwd(), [out_w, err_w])
    finally:
        os.close(out_w)
        os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    process = Forked(argv, conn)
    selector = selectors.DefaultSelector()
    for fd in chunks:
        selector.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(argv, timeout)
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
            # Its output ended; its exit code may still be on the way.
            code = process.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            process.kill()
            raise subprocess.TimeoutExpired(argv, timeout, b"".join(chunks[out_r]),
                                            b"".join(chunks[err_r])) from None
    finally:
        selector.close()
        os.close(out_r)
        os.close(err_r)
    return subprocess.CompletedProcess(argv, code, _text(chunks[out_r]), _text(chunks[err_r]))


def start(argv: list[str], *, env: dict[str, str], cwd: str, output: int) -> Forked | None:
    """``argv`` forked, running: its stdout and stderr the file ``output``,
    its stdin ``/dev/null``; None when it cannot be forked (start it yourself)."""
    server = _server_for(argv, env)
    if server is None:
        return None
    return Forked(argv, server.send(argv, env, cwd, [output, output]))


class Forked:
    """A forked command, as much of ``subprocess.Popen`` as the tests use:
    ``pid``, ``poll``, ``wait``, ``kill``, ``returncode``. Its exit code comes
    from its handler, the process that forked it and waits for it."""

    def __init__(self, argv: list[str], conn: socket.socket) -> None:
        self.args = argv
        self._conn = conn
        self.returncode: int | None = None
        self.pid = int(self._message("pid", None))

    def _message(self, word: str, timeout: float | None) -> str:
        self._conn.settimeout(timeout)
        try:
            message = self._conn.recv(256).decode()
        except TimeoutError:
            raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
        if not message:  # the handler died: a defect of this module
            raise RuntimeError(f"forkserver: no {word} for {self.args[1:]}")
        said, value = message.split()
        assert said == word, message
        return value

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._message("exit", timeout))
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # Its handler reaps it at once (no zombie holds the pid, as Popen's
        # does): once its exit code has come, the pid may be another's.
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)


def _text(chunks: list[bytes]) -> str:
    # As subprocess's text mode: the locale's encoding (UTF-8 here), universal newlines.
    return b"".join(chunks).decode().replace("\r\n", "\n").replace("\r", "\n")


# -- the server's side -------------------------------------------------------------------


def _serve(path: str) -> None:
    import gc
    import importlib

    # Not this file's directory: the command's own first entry is set when it forks.
    sys.path[0] = os.path.dirname(sys.executable)
    for module in _PRELOAD:
        importlib.import_module(module)
    # The imports' objects stay in the pages the children share.
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    Path(path).with_name("ready").touch()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)  # EOF: the test process has gone
    while True:
        for key, _ in selector.select(1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                if os.fork() == 0:
                    listener.close()
                    _handle(conn)
                conn.close()
            elif not os.read(sys.stdin.fileno(), 1):
                return
        _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _handle(conn: socket.socket) -> None:
    """The handler: fork the command, report its pid and then its exit code."""
    try:
        data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 2)
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _command(request, fds)
        for fd in fds:
            os.close(fd)
        conn.send(f"pid {pid}".encode())
        _, status = os.waitpid(pid, 0)
        conn.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
    finally:
        os._exit(0)


def _command(request: dict[str, Any], fds: list[int]) -> None:
    """The command's process: the test's pipes as stdout and stderr, its
    environment and directory, then ``cli.main.main`` and a shutdown."""
    code = 1
    try:
        stdin = os.open(os.devnull, os.O_RDONLY)
        for target, fd in ((0, stdin), (1, fds[0]), (2, fds[1])):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # The one module that reads the environment when it is imported: the
        # fault points a test arms through REORG_FAULTS.
        from framework import faults

        faults.load_from_env()
        import importlib

        import cli.main

        argv = request["argv"]
        if os.path.basename(argv[0]) == "reorg":
            # The installed script: its directory first on the path.
            sys.argv, sys.path[0] = argv, os.path.dirname(argv[0])
        else:
            # python -m cli.main ...: the module's file as argv[0], the directory first.
            sys.argv, sys.path[0] = [cli.main.__file__, *argv[3:]], request["cwd"]
        importlib.invalidate_caches()  # distributions installed since the server started
        cli.main.main()
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        code = _shutdown(code)
        os._exit(code)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _shutdown(code: int) -> int:
    """What the interpreter does at exit: wait for non-daemon threads, run
    ``atexit``, flush the streams."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        return 120  # as Python when flushing at exit fails
    return code


# Imported once by the server: the libraries and modules commands import.
_PRELOAD = (
    "cli.main",
    "cli.submit",
    "cli.jobs",
    "cli.history",
    "cli.nodes",
    "cli.db",
    "cli.output",
    "cli.progress",
    "framework.db",
    "framework.submit",
    "framework.store",
    "cli.worker",
    "framework.node",
    "framework.worker",
    "framework.owner",
    "backfill.sql_update.job",
    "sqlalchemy",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
    "rich.console",
    "rich.table",
)


if __name__ == "__main__":
    _serve(sys.argv[1])
