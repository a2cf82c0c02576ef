"""``reorg`` commands forked from one warm process instead of started cold.

A ``reorg`` process spends most of its CPU importing typer, rich, SQLAlchemy
and psycopg (0.4-0.9 CPU-s a command); the suite runs hundreds of them on two
cores. Here one server process per test process imports them once, then
forks a child per command. The child is still a process of its own: its own
stdin (``/dev/null``), stdout and stderr (pipes to the test), environment,
working directory, exit code, and interpreter shutdown (threads joined,
``atexit`` run); it runs ``cli.main.main`` as the installed script does.

What a fork does not reproduce, so the tests of it start real processes
(``subprocess`` with the installed ``reorg``): what a command imports
(``test_command_imports``), a Ctrl-C during start-up (``test_cli_interrupts``),
terminals and signals (``cli_support.Running``), and anything read at
interpreter start (``PYTHON*`` variables: a command whose environment has
other ones than the server's runs as a real process). ``TESTS_FORK_COMMANDS=0``
runs every command as a real process.

The server is started on first use and ends with the test process: it reads
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
import selectors
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
    def __init__(self, script: str, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="reorg-forkserver-")
        self.path = os.path.join(self.dir, "socket")
        self.log = os.path.join(self.dir, "server.log")
        self.startup = _startup_env(env)
        with open(self.log, "wb") as log:
            # Its own session: a signal to the test's process group is not for it.
            self.proc = subprocess.Popen(
                [sys.executable, __file__, self.path, str(Path(script).parent)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, env=env,
                start_new_session=True)
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

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_server: _Server | None = None
_server_failed = False
_lock = threading.Lock()


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    """What Python reads from the environment when it starts."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


def _server_for(script: str, env: dict[str, str]) -> _Server | None:
    global _server, _server_failed
    with _lock:
        if _server is None and not _server_failed:
            server = _Server(script, env)
            if server.wait_ready():
                _server = server
            else:
                _server_failed = True
                server.stop()
                sys.stderr.write(f"forkserver did not start; real processes from now on:\n"
                                 f"{Path(server.log).read_text(errors='replace')}\n")
        return _server


def server_pid() -> int | None:
    """The server's pid, once one runs."""
    return _server.proc.pid if _server is not None else None


def run(argv: list[str], *, env: dict[str, str], timeout: float,
        cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, stdin=DEVNULL,
    env=env, timeout=timeout)``, where ``argv[0]`` is the installed ``reorg``."""
    server = _server_for(argv[0], env) if ENABLED else None
    if server is None or _startup_env(env) != server.startup:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=cwd, stdin=subprocess.DEVNULL)
    return _forked(server, argv, env, timeout, cwd or os.getcwd())


def _forked(server: _Server, argv: list[str], env: dict[str, str], timeout: float,
            cwd: str) -> subprocess.CompletedProcess[str]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(server.path)
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        socket.send_fds(conn, [request], [out_w, err_w])
    finally:
        os.close(out_w)
        os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    pid: int | None = None
    code: int | None = None
    selector = selectors.DefaultSelector()
    for fd in chunks:
        selector.register(fd, selectors.EVENT_READ)
    selector.register(conn, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while len(selector.get_map()) > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                if pid is not None:
                    _kill(pid)
                raise subprocess.TimeoutExpired(argv, timeout, b"".join(chunks[out_r]),
                                                b"".join(chunks[err_r]))
            for key, _ in selector.select(left):
                if key.fileobj is conn:
                    message = conn.recv(256).decode()
                    if not message:  # the handler died: a defect of this module
                        raise RuntimeError(f"forkserver gave no exit code for {argv[1:]}; "
                                           f"see {server.log}")
                    word, value = message.split()
                    if word == "pid":
                        pid = int(value)
                    else:
                        code = int(value)
                        selector.unregister(conn)
                else:
                    fd = key.fd
                    data = os.read(fd, 65536)
                    if data:
                        chunks[fd].append(data)
                    else:
                        selector.unregister(fd)
    finally:
        selector.close()
        conn.close()
        os.close(out_r)
        os.close(err_r)
    assert code is not None
    return subprocess.CompletedProcess(argv, code, _text(chunks[out_r]), _text(chunks[err_r]))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)


def _text(chunks: list[bytes]) -> str:
    # As subprocess's text mode: the locale's encoding (UTF-8 here), universal newlines.
    return b"".join(chunks).decode().replace("\r\n", "\n").replace("\r", "\n")


# -- the server's side -------------------------------------------------------------------


def _serve(path: str, bindir: str) -> None:
    import gc
    import importlib

    # As the installed script: its directory first on the path, not this one's.
    sys.path[0] = bindir
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
        sys.argv = request["argv"]
        import importlib

        importlib.invalidate_caches()  # distributions installed since the server started
        from cli.main import main

        main()
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
    "sqlalchemy",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
    "rich.console",
    "rich.table",
)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
