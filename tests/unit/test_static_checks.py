"""The code stays ruff-clean and type-checks (STYLE lesson 9)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing():
    result = _run("mypy", "framework", "backfill", "cli", "migrations", "bench")
    assert result.returncode == 0, result.stdout + result.stderr
