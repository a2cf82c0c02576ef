"""A second "host" for partition tests: a network namespace joined to this one
by a veth pair, plus a TCP relay in this namespace that forwards the host's
address to the test PostgreSQL on loopback. Cutting the veth link is a real
partition: packets vanish, nothing is reset, calls simply hang."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass, field


def netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"reorg-probe-{uuid.uuid4().hex[:6]}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Host:
    """A network namespace that reaches this namespace at ``gateway``."""

    name: str
    gateway: str
    address: str
    _veth: str = ""

    @classmethod
    def create(cls, index: int) -> Host:
        tag = uuid.uuid4().hex[:5]
        name, veth, peer = f"reorg-{tag}", f"rg{tag}h", f"rg{tag}n"
        host = cls(name, f"10.231.{index}.1", f"10.231.{index}.2", veth)
        _ip("netns", "add", name)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", name)
        _ip("addr", "add", f"{host.gateway}/30", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("-n", name, "addr", "add", f"{host.address}/30", "dev", peer)
        _ip("-n", name, "link", "set", peer, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        return host

    def partition(self) -> None:
        _ip("link", "set", self._veth, "down")

    def heal(self) -> None:
        _ip("link", "set", self._veth, "up")

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def destroy(self) -> None:
        subprocess.run(["ip", "link", "del", self._veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


@dataclass
class Relay:
    """Forwards ``listen`` to ``target`` (both (host, port)), byte for byte."""

    listen: tuple[str, int]
    target: tuple[str, int]
    _server: socket.socket = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Relay:
        self._server = socket.create_server(self.listen)
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._server.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
