"""The acceptance tests fork their ``reorg`` commands from a warm process
(``support.forkserver``). Those forks must be what a ``reorg`` started cold
is, or the tests would check something no user runs: the same stdout, stderr
and exit code, and a timeout that ends the command."""

from __future__ import annotations

import os
import subprocess

import pytest
from cli_support import submit
from support import forkserver, wait_until
from support.processes import REORG, clean_env, proc_state

UNREACHABLE = "postgresql://x@127.0.0.1:1/x"

COMMANDS = {
    "help": ["--help"],
    "a bad option": ["status", "--colour", "red"],
    "an unreachable database": ["--db", UNREACHABLE, "status"],
    "a listing": ["status", "--json"],
    "a job": ["status", "{job}", "--json"],
    "a bad submit": ["submit", "sql-update", "--table", "items", "--set", "c=md5(nope)"],
}


@pytest.mark.parametrize("args", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_forked_command_prints_and_exits_as_a_cold_one(items_db: str, args: list[str]) -> None:
    assert REORG and forkserver.ENABLED
    job = submit(items_db, "--table", "items", "--set", "c=b")
    argv = [REORG, *(["--db", items_db] if "--db" not in args else []),
            *(a.format(job=job) for a in args)]
    env = clean_env()
    cold = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)
    forked = forkserver.run(argv, env=env, timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
           (cold.returncode, cold.stdout, cold.stderr)
    assert cold.stdout + cold.stderr  # each command says something


def test_a_forked_command_past_its_timeout_is_killed(items_db: str) -> None:
    job = submit(items_db, "--table", "items", "--set", "c=b")  # no worker: it never ends
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([REORG, "--db", items_db, "wait", str(job)],  # type: ignore[list-item]
                       env=clean_env(), timeout=3)
    # The `reorg wait` it forked is killed, then its handler reports and ends.
    servers = forkserver.server_pids()
    assert servers
    wait_until(lambda: not any(_children(s) for s in servers), 10, "the forked `reorg wait` gone")


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and proc_state(int(entry)) not in ("gone", "Z"):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except FileNotFoundError:
                continue
            if parent == pid:
                found.append(int(entry))
    return found
