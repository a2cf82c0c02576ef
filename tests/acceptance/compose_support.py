"""docker-compose.yml and the Dockerfile, read for tests that run their
commands outside containers (no Docker engine here): each service's command,
environment and healthcheck, with the compose network's host names and ports
mapped onto this machine's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = ROOT / "Dockerfile"
# The compose file's fixed ports, each mapped to a free local port by a test.
COMPOSE_PORTS = {"master": 7077, "master_ui": 8080, "worker_ui": 8081, "metrics": 9108}


def reorg_image_services() -> dict[str, dict[str, Any]]:
    """Services built from the Dockerfile."""
    return {name: s for name, s in SERVICES.items() if s.get("build")}


def localize(arg: str, ports: Mapping[str, int]) -> str:
    """One command argument with compose's host names replaced by 127.0.0.1
    and its fixed ports by ``ports`` (keyed as COMPOSE_PORTS)."""
    arg = re.sub(r"\bspark-master\b", "127.0.0.1", arg)
    for name, port in COMPOSE_PORTS.items():
        arg = re.sub(rf"(?<!\d){port}(?!\d)", str(ports[name]), arg)
    return arg


def command(service: str, ports: Mapping[str, int]) -> list[str]:
    return [localize(a, ports) for a in SERVICES[service]["command"]]


def healthcheck(service: str, ports: Mapping[str, int]) -> list[str]:
    test = SERVICES[service]["healthcheck"]["test"]
    assert test[0] == "CMD", f"{service}: healthcheck must be exec form (no shell in it)"
    return [localize(a, ports) for a in test[1:]]


def environment(service: str, ports: Mapping[str, int], database_url: str) -> dict[str, str]:
    """The service's environment on this machine: its REORG_* settings (the
    database URL pointed at ``database_url``) over an environment cleared of
    REORG_*, and the image's ENV lines that apply outside it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REORG_")}
    env["REORG_SPARK_CDS"] = "off"  # tests never build the class-data archive in $HOME
    for key, value in (SERVICES[service].get("environment") or {}).items():
        env[key] = localize(str(value), ports)
    if "REORG_DATABASE_URL" in env:
        env["REORG_DATABASE_URL"] = database_url
    return env


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match, f"Dockerfile has no ARG {name}=..."
    return match.group(1)


def pg_tool(name: str) -> str:
    """A PostgreSQL client binary (Debian keeps some off PATH)."""
    from framework.localpg.cluster import find_binaries

    found = shutil.which(name)
    return found or str(find_binaries() / name)


def run(argv: list[str], env: Mapping[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=dict(env) if env else None, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
