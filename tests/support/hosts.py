"""Several "hosts" on this machine: network namespaces on one bridge, a
PostgreSQL of their own listening on the bridge, and optionally a real Spark
standalone cluster (master and worker from the pyspark installation's
``spark-class``). Used by tests/fault/test_multihost*.py and by bench/soak.py.

::

    root namespace                              namespace rgE-<tag>-<host>
    ┌──────────────────────────────┐            ┌──────────────────────────┐
    │ bridge rgEb<tag> 10.213.N.1   │── veth ──►│ 10.213.N.(10+i)          │
    │   PostgreSQL :port           │            │  reorg worker (driver)   │
    │   Spark master :7077, worker │            │  nft table inet rgE      │
    └──────────────────────────────┘            └──────────────────────────┘

A partition is an nft rule set inside the host's namespace that drops the
packets to and/or from PostgreSQL (``Host.partition``): real loss, nothing is
reset, calls hang until a timeout, as on a real network. Only this machine's
addresses are involved (the bridge and the namespaces' private links).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from framework.localpg.cluster import LocalPostgres
from support.db import wait_until

PREFIX = "rgE"  # every namespace, link and nft table this module makes starts with it


def available() -> bool:
    """Root, ``ip`` and ``nft``: what the hosts need."""
    return os.geteuid() == 0 and all(shutil.which(b) for b in ("ip", "nft"))


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> str:
    """A 10.213.N prefix no interface of this machine uses yet."""
    used = _run("ip", "-4", "-o", "addr")
    for _ in range(50):
        prefix = f"10.213.{random.randint(1, 254)}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.213.N.0/24 subnet")


@dataclass
class Host:
    """One network namespace with an address on the bridge."""

    name: str
    netns: str
    address: str
    gateway: str  # the root namespace's bridge address: PostgreSQL and Spark
    pg_port: int

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def partition(self, direction: str = "both") -> None:
        """Drop PostgreSQL traffic in this namespace: ``out`` (requests never
        arrive), ``in`` (replies never arrive) or ``both``. Spark stays reachable."""
        rules = []
        if direction in ("out", "both"):
            rules.append(f"add rule inet {PREFIX} out ip daddr {self.gateway} tcp dport "
                         f"{self.pg_port} drop")
        if direction in ("in", "both"):
            rules.append(f"add rule inet {PREFIX} in ip saddr {self.gateway} tcp sport "
                         f"{self.pg_port} drop")
        self.heal()
        script = "\n".join([
            f"add table inet {PREFIX}",
            f"add chain inet {PREFIX} in {{ type filter hook input priority 0; }}",
            f"add chain inet {PREFIX} out {{ type filter hook output priority 0; }}",
            *rules, ""])
        subprocess.run(self.command(["nft", "-f", "-"]), input=script, text=True, check=True,
                       capture_output=True)

    def heal(self) -> None:
        subprocess.run(self.command(["nft", "delete", "table", "inet", PREFIX]),
                       capture_output=True)

    def dropped(self) -> bool:
        """True while a partition is in place."""
        return subprocess.run(self.command(["nft", "list", "table", "inet", PREFIX]),
                              capture_output=True).returncode == 0


@dataclass
class Network:
    """The bridge, its hosts and the PostgreSQL they reach."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    prefix: str = field(default_factory=_free_subnet)
    hosts: list[Host] = field(default_factory=list)
    pg: LocalPostgres | None = None
    _data_dir: Path | None = None
    _next: int = 0  # host addresses are never reused within a network

    @property
    def bridge(self) -> str:
        return f"{PREFIX}b{self.tag}"

    @property
    def gateway(self) -> str:
        return f"{self.prefix}.1"

    def start(self) -> Network:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        # Durable: a crash (pg_ctl -m immediate) must keep every acknowledged commit,
        # or the oracle would blame the framework for what fsync=off lost.
        self._data_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-pg-", dir="/tmp"))
        self.pg = LocalPostgres(self._data_dir, durable=True)
        self.pg.init()
        with open(self.pg.pgdata / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {self.prefix}.0/24 trust\n")
        with open(self.pg.pgdata / "postgresql.conf", "a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1,{self.gateway}'\n")
        self.pg.start()
        return self

    def add_host(self, name: str) -> Host:
        index = self._next
        self._next += 1
        netns = f"{PREFIX}-{self.tag}-{name}"
        outside, inside = f"{PREFIX}{self.tag}{index}h", f"{PREFIX}{self.tag}{index}n"
        host = Host(name, netns, f"{self.prefix}.{10 + index}", self.gateway, self.pg.port)
        _run("ip", "netns", "add", netns)
        self.hosts.append(host)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", netns)
        _run("ip", "link", "set", outside, "master", self.bridge)
        _run("ip", "link", "set", outside, "up")
        _run("ip", "-n", netns, "addr", "add", f"{host.address}/24", "dev", inside)
        _run("ip", "-n", netns, "link", "set", inside, "up")
        _run("ip", "-n", netns, "link", "set", "lo", "up")
        return host

    def remove_hosts(self, hosts: list[Host]) -> None:
        """Delete the hosts' namespaces (their veth ends and nft tables go with them)."""
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            if host in self.hosts:
                self.hosts.remove(host)

    def admin_url(self, dbname: str = "postgres") -> str:
        return self.pg.url(dbname)

    def url_from_hosts(self, dbname: str) -> str:
        """The database as a host reaches it: through the bridge."""
        return f"postgresql://postgres@{self.gateway}:{self.pg.port}/{dbname}"

    def crash_postgres(self) -> None:
        """Kill the server as a power cut would (no checkpoint, no goodbye)."""
        self.pg._run("pg_ctl", "-D", str(self.pg.pgdata), "-m", "immediate", "-w", "stop")

    def start_postgres(self) -> None:
        self.pg.start()

    def stop(self) -> None:
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.stop()
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)


@contextlib.contextmanager
def network() -> Iterator[Network]:
    net = Network()
    try:
        yield net.start()
    finally:
        net.stop()


# -- Spark standalone --------------------------------------------------------------


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class SparkCluster:
    """A Spark standalone master and one worker (2 cores, 1g: one 512m executor
    for each of two drivers), bound to the bridge address, started with the
    pyspark installation's ``spark-class``."""

    host: str
    port: int = 7077
    worker_memory: str = "1g"
    master: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix=f"{PREFIX}-spark-")))

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def _env(self) -> dict[str, str]:
        home = spark_home()
        return {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": self.host,
                "SPARK_DAEMON_MEMORY": "256m", "SPARK_WORKER_DIR": str(self.log_dir / "work"),
                "SPARK_NO_DAEMONIZE": "1"}

    def _spawn(self, name: str, *argv: str) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *argv],
                                env=self._env(), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def start_master(self) -> None:
        self.master = self._spawn("master", "org.apache.spark.deploy.master.Master",
                                  "--host", self.host, "--port", str(self.port),
                                  "--webui-port", "0")
        wait_until(lambda: "I have been elected leader" in self.log("master")
                   or self.master.poll() is not None, 120, "the Spark master to start")
        assert self.master.poll() is None, self.log("master")[-2000:]

    def start_worker(self) -> None:
        before = self.log("master").count("Registering worker")
        self.worker = self._spawn("worker", "org.apache.spark.deploy.worker.Worker",
                                  "--host", self.host, "--cores", "2", "--memory",
                                  self.worker_memory, "--webui-port", "0", self.url)
        wait_until(lambda: self.log("master").count("Registering worker") > before
                   or self.worker.poll() is not None, 120, "the Spark worker to register")
        assert self.worker.poll() is None, self.log("worker")[-2000:]

    def start(self) -> SparkCluster:
        self.start_master()
        self.start_worker()
        return self

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def executors(self) -> list[int]:
        """Pids of the executor JVMs the worker launched (its children)."""
        if self.worker is None or self.worker.poll() is not None:
            return []
        out = subprocess.run(["pgrep", "-P", str(self.worker.pid)], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def kill(self, which: str) -> None:
        """kill -9 of the master or of the worker with its executors (a lost host)."""
        proc = self.master if which == "master" else self.worker
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the session holds its executors too
        proc.wait(30)

    def stop(self) -> None:
        for which in ("worker", "master"):
            self.kill(which)
        shutil.rmtree(self.log_dir, ignore_errors=True)


def spark_conf_for(host: Host) -> str:
    """``REORG_SPARK_CONF`` for a worker in ``host``: executors reach its driver
    at the host's address; small executors, as the cluster is small."""
    return ";".join([f"spark.driver.host={host.address}", f"spark.driver.bindAddress={host.address}",
                     "spark.executor.memory=512m", "spark.executor.cores=1",
                     "spark.cores.max=1", "spark.driver.memory=512m"])


def wait_for_postgres(url: str, timeout: float = 60) -> None:
    def up() -> bool:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    wait_until(up, timeout, "PostgreSQL to accept connections", interval=0.2)


def elapsed(since: float) -> float:
    return round(time.monotonic() - since, 1)
