"""docker-compose.yml cannot be run here (no Docker engine), so this keeps it
honest another way: its services and environment must agree with the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer
import yaml

from cli.main import app

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


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
    assert {"postgres", "spark-master", "spark-worker", "reorg-worker"} <= set(SERVICES)
    worker = SERVICES["reorg-worker"]
    assert "reorg worker" in " ".join(worker["command"])
    assert worker["stop_signal"] == "SIGTERM"  # drains: releases its leases at once
    assert "reorg db upgrade" in " ".join(SERVICES["reorg-migrate"]["command"])


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
