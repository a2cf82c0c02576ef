"""A password in the database URL never shows (docs/security.md): not in the
worker's text or JSON log, a job's stored error, its events, ``reorg
status``, ``reorg nodes``, the dashboard, nor in the one error line of a
command that cannot connect. Every URL here carries PASSWORD; the failing job
raises an error that quotes a URL with it, as a driver might."""

from __future__ import annotations

import urllib.request

from cli_support import assert_one_error_line, ok, reorg
from dashboard_support import running_dashboard
from security_support import PASSWORD, Installation
from support import execute, wait_until
from support.processes import REORG, clean_env

from framework.localpg.cluster import free_port


def test_no_surface_shows_the_password(installation: Installation) -> None:
    inst = installation
    inst.as_role("app", f"""
        CREATE FUNCTION boom() RETURNS text LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'cannot reach postgresql://app:{PASSWORD}@db.internal/app';
        END $$""")
    text = inst.workers.start_cli("w-text")
    as_json = inst.workers.start_cli("w-json", "--log-format", "json")
    alice = inst.url("alice")
    assert PASSWORD in alice  # the test means it

    done = int(ok(reorg(alice, "submit", "sql-update", "--table", "public.items",
                        "--set", "c=md5(b)", "--rows-per-subtask", "100")).strip())
    # One active job per table: the second waits for the first to end.
    assert reorg(alice, "wait", str(done), "--timeout", "60").returncode == 0
    failed = int(ok(reorg(alice, "submit", "sql-update", "--table", "public.items",
                          "--set", "c=boom()")).strip())
    waited = reorg(alice, "wait", str(failed), "--timeout", "60")
    assert waited.returncode == 1 and "postgresql://app:***@db.internal" in waited.stderr

    stored = execute(inst.admin_url, f"SELECT error FROM reorg.jobs WHERE id = {failed}")
    assert "***" in stored[0][0] and PASSWORD not in stored[0][0]
    shown = {
        "status": reorg(alice, "status"),
        "status --json": reorg(alice, "status", str(failed), "--json"),
        "events": reorg(alice, "events", str(failed), "--json"),
        "nodes": reorg(alice, "nodes", "--json"),
        "history": reorg(alice, "history", "--job", str(done)),
        "wait": waited,
    }
    for what, result in shown.items():
        assert PASSWORD not in result.stdout + result.stderr, what
    assert "db.internal" in shown["status --json"].stdout  # the error is there, masked

    with running_dashboard(alice) as dashboard:
        for path in ("/", f"/jobs/{failed}", f"/jobs/{failed}/fragments/events",
                     f"/jobs/{failed}/fragments/summary", "/fragments/jobs", "/fragments/nodes"):
            page = urllib.request.urlopen(dashboard.base + path, timeout=10).read().decode()
            assert PASSWORD not in page, path
        logged = dashboard.output()
    assert PASSWORD not in logged

    # The error is in both logs (the worker that ran the batch logged it).
    wait_until(lambda: "db.internal" in text.log() + as_json.log(), 10, "the failure logged")
    for worker in (text, as_json):
        assert PASSWORD not in worker.log(), worker.node_id


def test_a_command_that_cannot_connect_names_the_server_not_the_password() -> None:
    closed = free_port()
    for url in (f"postgresql://bob:{PASSWORD}@127.0.0.1:{closed}/appdb",
                f"postgresql://bob:{PASSWORD}@127.0.0.1:notaport/appdb",
                f"postgres://bob:{PASSWORD}@/appdb?host=/nonexistent"):
        line = assert_one_error_line(reorg(url, "status"), 5)
        assert PASSWORD not in line, line
    line = assert_one_error_line(reorg(f"postgresql://bob:{PASSWORD}@127.0.0.1:{closed}/appdb",
                                       "status"), 5)
    assert f"127.0.0.1:{closed}/appdb" in line


def test_a_worker_that_cannot_connect_logs_no_password() -> None:
    import subprocess

    url = f"postgresql://bob:{PASSWORD}@127.0.0.1:{free_port()}/appdb"
    assert REORG
    for fmt in ("text", "json"):
        result = subprocess.run([REORG, "--db", url, "worker", "--log-format", fmt],
                                capture_output=True, text=True, timeout=60, env=clean_env(),
                                stdin=subprocess.DEVNULL)
        assert result.returncode == 5, result.stderr
        assert "127.0.0.1" in result.stderr and PASSWORD not in result.stdout + result.stderr
