"""Pytest fixtures for tests with several "hosts" (support.hosts): a bridge and
a PostgreSQL of their own per module, a migrated database per test, hosts
(network namespaces) whose ``reorg worker`` processes reach that database
through the bridge, and a Spark standalone cluster per module. Everything is
torn down also when a test fails: namespaces, the bridge, nft tables (they
live in the namespaces), the processes this module started."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.faults import Gates
from support.db import create_database, drop_database
from support.hosts import Host, Network, SparkCluster, available, spark_conf_for
from support.processes import WorkerProcess, Workers

TEMPLATE = "reorg_hosts_template"


@pytest.fixture(scope="module")
def net() -> Iterator[Network]:
    if not available():
        pytest.skip("needs root, ip and nft (network namespaces)")
    network = Network()
    try:
        network.start()
        url = create_database(network.admin_url(), TEMPLATE)
        template = Database(Settings(url))
        migrate.upgrade(template)
        template.dispose()
        yield network
    finally:
        network.stop()


@pytest.fixture(scope="module")
def spark_cluster(net: Network) -> Iterator[SparkCluster]:
    cluster = SparkCluster(net.gateway)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@dataclass
class Cluster:
    """One test's database on ``net`` and the hosts and workers that use it."""

    net: Network
    db: Database
    dbname: str
    workers: Workers
    hosts: dict[str, Host] = field(default_factory=dict)

    def host(self, name: str) -> Host:
        if name not in self.hosts:
            self.hosts[name] = self.net.add_host(f"{name}{uuid.uuid4().hex[:3]}")
        return self.hosts[name]

    def start(self, node_id: str, *, on: str | None = None, spark: SparkCluster | None = None,
              **kw) -> WorkerProcess:
        """``reorg worker`` ``node_id`` inside host ``on`` (default: a host of its
        own named after it); with ``spark``, its backfill batches run there."""
        host = self.host(on or node_id)
        env = {"REORG_DATABASE_URL": self.net.url_from_hosts(self.dbname),
               "REORG_POLL_SECONDS": "0.2"}
        if spark is not None:
            env |= {"REORG_SPARK_MASTER": spark.url, "REORG_SPARK_CONF": spark_conf_for(host)}
        else:
            env["REORG_SPARK_WARMUP"] = "false"  # no Spark job here: spare the CPU a JVM costs
        return self.workers.start(node_id, prefix=host.command, **env, **kw)


@pytest.fixture
def cluster(net: Network, gates: Gates) -> Iterator[Cluster]:
    name = f"h_{uuid.uuid4().hex[:12]}"
    url = create_database(net.admin_url(), name, template=TEMPLATE)
    db = Database(Settings(url, lease_seconds=3, owner_lease_seconds=3, poll_seconds=0.2,
                           heartbeat_seconds=0.5, retry_backoff_seconds=0.2,
                           local_job_max_subtasks=0))
    pool = Workers(url, gates)
    c = Cluster(net, db, name, pool)
    try:
        yield c
    finally:
        for host in c.hosts.values():
            host.heal()  # partitioned workers must see SIGKILL's effect, not hang
        pool.stop_all()
        net.remove_hosts(list(c.hosts.values()))
        db.dispose()
        if net.pg.is_running():
            drop_database(net.admin_url(), name)
