"""A least-privilege installation end to end (docs/security.md): system
tables owned by an admin role, ``reorg worker`` connecting as a NOINHERIT
role with only the grants ``reorg db grants`` prints, users submitting and
cancelling; and every job's SQL running with its submitter's privileges,
never the worker's."""

from __future__ import annotations

import pytest
from cli_support import assert_one_error_line, dump, job_status, ok, reorg
from security_support import Installation
from support import TERMINAL, execute, wait_until

# A Spark submit or job starts a JVM (seconds, more on a loaded host).
SPARK_TIMEOUT = 180


def items(inst: Installation) -> list[tuple]:
    return execute(inst.admin_url, "SELECT id, a, b, c FROM items ORDER BY id")


def submit_as(inst: Installation, kind: str, *args: str) -> int:
    return int(ok(reorg(inst.url(kind), "submit", "sql-update", "--table", "public.items",
                        *args)).strip())


def test_a_job_runs_and_cancels_under_least_privilege_roles(installation: Installation) -> None:
    inst = installation
    worker = inst.workers.start_cli("w1")
    job_id = submit_as(inst, "alice", "--set", "c=md5(b)", "--rows-per-subtask", "250")
    waited = reorg(inst.url("alice"), "wait", str(job_id), "--timeout", "60")
    assert waited.returncode == 0, waited.stderr + worker.log()
    assert execute(inst.admin_url, "SELECT count(*) FROM items WHERE c = md5(b)") == [(1_000,)]
    assert job_status(inst.url("alice"), job_id)["state"] == "succeeded"
    # The worker holds no privilege of the users it acts as (NOINHERIT) and
    # cannot read another schema's tables it was not granted.
    assert execute(inst.admin_url, f"""
        SELECT rolinherit FROM pg_roles WHERE rolname = '{inst.roles["worker"]}'""") == [(False,)]

    # A slow job overwriting c, cancelled by its submitter: c is back as it was.
    before = items(inst)
    job_id = submit_as(inst, "alice", "--set", "c=upper(b)", "--batch-rows", "10",
                       "--concurrency", "1", "--max-rows-per-sec", "40")  # 25 s
    wait_until(lambda: job_status(inst.url("alice"), job_id)["rows_done"] > 0, 30,
               "job making progress")
    assert ok(reorg(inst.url("alice"), "cancel", str(job_id))).strip() == "cancelling"
    line = assert_one_error_line(
        reorg(inst.url("alice"), "wait", str(job_id), "--timeout", "60"), 1)
    assert f"job {job_id} cancelled" in line
    assert items(inst) == before


def test_an_expression_never_reads_what_its_submitter_cannot(installation: Installation) -> None:
    inst = installation
    inst.workers.start_cli("w1")
    before = items(inst)

    # Read directly: PostgreSQL refuses it when submit checks the statement.
    system = dump(inst.admin_url, skip=("nodes", "owner_lease", "job_progress_sample"))
    rejected = reorg(inst.url("alice"), "submit", "sql-update", "--table", "public.items",
                     "--set", "c = (SELECT secret FROM secret_table LIMIT 1)")
    line = assert_one_error_line(rejected, 2)
    assert "permission denied for table secret_table" in line
    assert dump(inst.admin_url, skip=("nodes", "owner_lease", "job_progress_sample")) == system

    # Read inside a function (submit's EXPLAIN never runs it): the worker could
    # read the table, but the batch runs as alice, so the job fails and reverts.
    job_id = submit_as(inst, "alice", "--set", "c = peek()")
    waited = reorg(inst.url("alice"), "wait", str(job_id), "--timeout", "60")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "permission denied for table secret_table" in waited.stderr
    status = job_status(inst.url("alice"), job_id)
    assert status["state"] == "reverted" and "secret_table" in status["error"]
    assert items(inst) == before

    # A function that switches back to the session's role (the worker's) and
    # stays there: caught before the batch commits, the job fails and reverts.
    inst.as_role("app", """
        CREATE FUNCTION escape() RETURNS text LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM set_config('role', session_user::text, true);
            RETURN (SELECT secret FROM secret_table LIMIT 1);
        END $$""")
    job_id = submit_as(inst, "alice", "--set", "c = escape()")
    waited = reorg(inst.url("alice"), "wait", str(job_id), "--timeout", "60")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "switched its role" in waited.stderr
    assert items(inst) == before

    # The same by bob, who may read the secret: it runs.
    job_id = submit_as(inst, "bob", "--set", "c = peek()")
    assert reorg(inst.url("bob"), "wait", str(job_id), "--timeout", "60").returncode == 0
    assert execute(inst.admin_url, "SELECT DISTINCT c FROM items") == [("s3cret-value",)]


def test_a_submitter_the_workers_may_not_act_as_is_refused(installation: Installation) -> None:
    inst = installation
    before = dump(inst.admin_url, schemas=("public",))
    # No worker runs: submit cannot know the workers' role, the owner refuses it.
    job_id = submit_as(inst, "carol", "--set", "c=md5(b)")
    inst.workers.start_cli("w1")
    wait_until(lambda: job_status(inst.url("carol"), job_id)["state"] in TERMINAL, 60,
               "the owner to refuse the job")
    status = job_status(inst.url("carol"), job_id)
    assert status["state"] == "reverted"
    assert (f"may not act as {inst.roles['carol']}: run GRANT \"{inst.roles['carol']}\" TO "
            f"\"{inst.roles['worker']}\"") in status["error"]
    assert dump(inst.admin_url, schemas=("public",)) == before

    # With a worker live, submit itself refuses: one line, no change.
    wait_until(lambda: execute(inst.admin_url, """
        SELECT count(*) FROM pg_stat_activity WHERE application_name = 'reorg-worker'""")[0][0],
               30, "the worker connected")
    system = dump(inst.admin_url, skip=("nodes", "owner_lease", "job_progress_sample"))
    line = assert_one_error_line(reorg(inst.url("carol"), "submit", "sql-update", "--table",
                                       "public.items", "--set", "c=md5(b)"), 2)
    assert f"may not act as your role {inst.roles['carol']}" in line
    assert dump(inst.admin_url, skip=("nodes", "owner_lease", "job_progress_sample")) == system


def test_a_submitter_who_may_not_do_what_the_job_does_is_refused(
        installation: Installation) -> None:
    inst = installation
    inst.as_role("app", f"REVOKE UPDATE ON items FROM {inst.roles['alice']}")
    system = dump(inst.admin_url)
    line = assert_one_error_line(reorg(inst.url("alice"), "submit", "sql-update", "--table",
                                       "public.items", "--set", "c=md5(b)"), 2)
    assert f"role {inst.roles['alice']} may not update public.items" in line
    assert f"GRANT UPDATE ON public.items TO \"{inst.roles['alice']}\"" in line
    # Adding a column is ALTER TABLE: only the table's owner may.
    line = assert_one_error_line(reorg(inst.url("bob"), "submit", "sql-update", "--table",
                                       "public.items", "--set", "d=md5(b)",
                                       "--add-column", "d:text"), 2)
    assert f"only its owner {inst.roles['app']} may do" in line
    assert dump(inst.admin_url) == system


def test_db_grants_refuses_unknown_roles_and_tables(installation: Installation) -> None:
    inst = installation
    admin = inst.url("admin")
    for args, says in (
            (["--worker-role", "no_such_role_x"], "role 'no_such_role_x' does not exist"),
            (["--worker-role", inst.roles["worker"], "--user-role", "nobody_y"],
             "role 'nobody_y' does not exist"),
            (["--worker-role", inst.roles["worker"], "--table", "public.nope"],
             "table 'public.nope' does not exist")):
        line = assert_one_error_line(reorg(admin, "db", "grants", *args), 2)
        assert says in line, line
    printed = ok(reorg(admin, "db", "grants", "--worker-role", inst.roles["worker"]))
    assert f'GRANT USAGE, CREATE ON SCHEMA "reorg" TO "{inst.roles["worker"]}";' in printed
    assert "--user-role" not in printed and "TO \"sec_alice" not in printed


@pytest.mark.spark
# Workers with Spark: the matrix; in CI, the same reads as the submitter in
# process (tests/integration/test_spark_privileges.py).
@pytest.mark.matrix
def test_a_backfill_runs_under_least_privilege_roles(installation: Installation) -> None:
    """The Spark path: the owner's analysis and every batch read over JDBC as
    alice, the merge as the worker role; then a --where calling peek() fails
    for alice, the table unchanged."""
    inst = installation
    worker = inst.workers.start_cli("w1")
    alice = inst.url("alice")
    submitted = reorg(alice, "submit", "backfill", "--table", "public.items",
                      "--set", "c=upper(b)", timeout=SPARK_TIMEOUT)
    job_id = int(ok(submitted).strip())
    waited = reorg(alice, "wait", str(job_id), "--timeout", str(SPARK_TIMEOUT))
    assert waited.returncode == 0, waited.stderr + worker.log()
    assert execute(inst.admin_url, "SELECT count(*) FROM items WHERE c = upper(b)") == [(1_000,)]

    before = items(inst)
    line = assert_one_error_line(reorg(alice, "submit", "backfill", "--table", "public.items",
                                       "--set", "c=lower(b)", "--where", "peek() IS NOT NULL",
                                       timeout=SPARK_TIMEOUT), 2)
    assert "permission denied for table secret_table" in line
    assert items(inst) == before
