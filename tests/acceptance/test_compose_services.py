"""docker-compose.yml's services run outside containers (no Docker engine
here): each service's own command, environment and healthcheck, taken from
the compose file, with the compose network's host names and fixed ports
mapped onto this machine (compose_support). In compose order: the one-shot
migration on an empty database, the Spark master and worker, then a reorg
worker whose healthcheck passes, which runs a Spark job on that cluster and
drains on SIGTERM (the compose file's stop signal).

The whole shape takes minutes on a busy 2-core machine (three JVMs), so it is
in the ``matrix`` set; CI runs its short form: the migration and a worker
running a PostgreSQL-only job (no JVM), healthcheck, JSON logs and drain."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from compose_support import COMPOSE_PORTS, SERVICES, command, environment, healthcheck, run
from support import wait_until
from support.hosts import spark_home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _executable(argv: list[str]) -> list[str]:
    """The image has spark-class on PATH; here it is in the pyspark installation."""
    if argv[0] == "spark-class" and not shutil.which("spark-class"):
        return [str(spark_home() / "bin" / "spark-class"), *argv[1:]]
    return argv


class Services:
    """The long-running services, started from their compose commands."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, service: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.directory / f"{service}.log", "wb")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(_executable(argv), env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[service] = proc
        return proc

    def log(self, service: str) -> str:
        return (self.directory / f"{service}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    running = Services(tmp_path)
    yield running
    running.stop()


def _healthy(service: str, ports: dict[str, int], env: dict[str, str]) -> bool:
    return run(healthcheck(service, ports), env, timeout=15).returncode == 0


def _wait_healthy(services: Services, service: str, ports: dict[str, int],
                  env: dict[str, str]) -> None:
    proc = services.procs[service]
    wait_until(lambda: proc.poll() is not None or _healthy(service, ports, env), 120,
               f"{service}'s healthcheck to pass")
    assert proc.poll() is None, services.log(service)[-3000:]


def _migrate(fresh_db: str, ports: dict[str, int]) -> None:
    """reorg-migrate: once, on an empty database, before any worker."""
    env = environment("reorg-migrate", ports, fresh_db)
    migrated = run(command("reorg-migrate", ports), env)
    assert migrated.returncode == 0, migrated.stderr
    current = run(["reorg", "db", "current"], env)
    assert current.returncode == 0 and "(head)" in current.stdout, current.stdout + current.stderr


def _start_worker(services: Services, fresh_db: str, ports: dict[str, int]) -> tuple[
        subprocess.Popen, dict[str, str]]:
    """One reorg worker: its healthcheck passes once its /healthz says it is healthy."""
    env = {**environment("reorg-worker", ports, fresh_db), "SPARK_LOCAL_IP": "127.0.0.1"}
    assert env["REORG_SPARK_MASTER"] == f"spark://127.0.0.1:{ports['master']}"
    worker = services.start("reorg-worker", command("reorg-worker", ports), env)
    _wait_healthy(services, "reorg-worker", ports, env)
    return worker, env


def _run_job(services: Services, fresh_db: str, env: dict[str, str], job_type: str) -> None:
    engine = sa.create_engine(fresh_db.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items (id bigint PRIMARY KEY, b text, c text)"))
        conn.execute(sa.text("INSERT INTO items SELECT g, 'item ' || g, NULL "
                             "FROM generate_series(1, 5000) g"))
    submitted = run(["reorg", "submit", job_type, "--table", "items", "--set", "c = md5(b)"],
                    env, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[-1]
    waited = run(["reorg", "wait", job_id, "--timeout", "240"], env, timeout=300)
    assert waited.returncode == 0, (waited.stdout + waited.stderr
                                    + services.log("reorg-worker")[-3000:])
    with engine.begin() as conn:
        wrong = conn.execute(sa.text(
            "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)")).scalar()
    engine.dispose()
    assert wrong == 0


def _logs_are_json_and_sigterm_drains(services: Services, worker: subprocess.Popen) -> None:
    # REORG_LOG_FORMAT=json in the compose file: one object a line.
    lines = [line for line in services.log("reorg-worker").splitlines() if line.strip()]
    assert lines and all(json.loads(line) for line in lines)
    # The compose file's stop signal drains the worker within its grace period.
    assert SERVICES["reorg-worker"]["stop_signal"] == "SIGTERM"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, services.log("reorg-worker")[-3000:]


def test_migration_and_a_worker_run_from_their_compose_commands(
        fresh_db: str, services: Services) -> None:
    ports = {name: _free_port() for name in COMPOSE_PORTS}
    _migrate(fresh_db, ports)
    worker, env = _start_worker(services, fresh_db, ports)
    _run_job(services, fresh_db, env, "sql-update")
    _logs_are_json_and_sigterm_drains(services, worker)


@pytest.mark.matrix
@pytest.mark.spark
def test_every_compose_service_runs_from_its_command_and_passes_its_healthcheck(
        fresh_db: str, services: Services, tmp_path: Path) -> None:
    ports = {name: _free_port() for name in COMPOSE_PORTS}
    spark_env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
                 "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_MEMORY": "256m",
                 "SPARK_WORKER_DIR": str(tmp_path / "spark-work")}
    _migrate(fresh_db, ports)
    # Spark master, then worker (it depends on the master being healthy).
    services.start("spark-master", command("spark-master", ports), spark_env)
    _wait_healthy(services, "spark-master", ports, spark_env)
    services.start("spark-worker", command("spark-worker", ports), spark_env)
    _wait_healthy(services, "spark-worker", ports, spark_env)
    worker, env = _start_worker(services, fresh_db, ports)
    _run_job(services, fresh_db, env, "backfill")
    master = json.load(urllib.request.urlopen(
        f"http://127.0.0.1:{ports['master_ui']}/json/", timeout=5))
    assert master.get("activeapps", []) + master.get("completedapps", []), \
        "the job ran without the Spark cluster"
    _logs_are_json_and_sigterm_drains(services, worker)
