"""A one-minute run of the soak (bench/soak.py), so the script keeps working:
faults injected at random while jobs run and an application writes; its
verdict must be clean (no row lost, duplicated or stale). Matrix only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.hosts import available

pytestmark = [pytest.mark.fault, pytest.mark.matrix,
              pytest.mark.skipif(not available(), reason="needs root, ip and nft")]


def test_one_minute_soak_is_clean():
    done = subprocess.run([sys.executable, "-m", "bench.soak", "--minutes", "1", "--rows", "10000",
                           "--fault-every", "5"], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0 and "verdict: clean" in done.stdout, done.stdout + done.stderr
