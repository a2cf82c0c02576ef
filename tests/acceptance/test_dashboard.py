"""``reorg dashboard`` as a person sees it: the command run as a subprocess
against a real PostgreSQL, a real worker running a job held mid-way by fault
blocks, and a real headless Chromium reading the page.

Screenshots: tests/artifacts/dashboard.png (the jobs and nodes) and
tests/artifacts/dashboard-job.png (one job, its events and subtasks)."""

from __future__ import annotations

import signal
import time
import urllib.request

from cli_support import assert_one_error_line, reorg
from dashboard_support import (
    chromium,
    post,
    running_dashboard,
    screenshot,
    text_of,
    texts_of,
    wait_for,
)
from selenium.webdriver.common.by import By
from sqlalchemy.engine import make_url
from support import execute, fill, job_of, make_items, scalar
from support.processes import Workers

from framework import faults
from framework.db import Database, describe_url
from framework.store import jobs
from framework.submit import submit

TOKEN = "s3cret-token"
PASSWORD = "pw-never-shown"
# One slot; its first batch commits and it waits (25 % of nothing yet: 500 of
# 4,000 rows); once released it finishes that subtask and waits again right
# after claiming the second: a job held mid-way twice, at two percents.
HOLD = "worker.after_batch=block@1,worker.after_claim=block@2"


def _events(db: Database, job_id: int) -> list[tuple[str, str]]:
    return [(actor, to) for actor, to in execute(
        db, "SELECT actor, to_state FROM reorg.job_events WHERE job_id = :j ORDER BY id",
        {"j": job_id})]


def test_live_progress_events_subtasks_pause_and_resume_with_the_token(
        db: Database, migrated_db: str, workers: Workers) -> None:
    make_items(db, 4_000)
    job = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=500)).job_id
    workers.start("w1", slots=1, faults=HOLD)
    assert workers.gates is not None
    workers.gates.wait_blocked("worker.after_batch", 60)
    first = job_of(db, job)
    assert first["state"] == "running" and first["percent"] > 0

    with running_dashboard(migrated_db, REORG_DASHBOARD_TOKEN=TOKEN) as dash, \
            chromium() as browser:
        browser.get(dash.base + "/")
        row = f"#job-{job}"
        wait_for(browser, lambda: text_of(browser, f"{row} .percent") == f"{first['percent']:.1f}%",
                 30, f"job {job} at {first['percent']:.1f}% on the page")
        assert text_of(browser, f"{row} .state") == "running"
        assert text_of(browser, f"{row} td:nth-child(2)") == "test-fill"
        assert "w1" in text_of(browser, "#nodes") and "owner" in text_of(browser, "#nodes")
        assert f"database {describe_url(migrated_db)}" in text_of(browser, "header")
        assert "postgresql://" not in browser.page_source
        # What holds the job's batches, as `reorg status` says it.
        with db.begin() as conn:
            jobs.note_throttled(db, conn, job, "replica lag 12.0s > 5s (standby1)")
        wait_for(browser, lambda: text_of(browser, f"#job-{job}-throttled")
                 == "throttled: replica lag 12.0s > 5s (standby1)", 30, "the throttled note")
        with db.begin() as conn:
            jobs.note_throttled(db, conn, job, None)

        # The job moves on; the page follows without reloading (the mark a
        # reload would wipe out stays).
        browser.execute_script("window.stillTheSamePage = true")
        workers.gates.release("worker.after_batch")
        workers.gates.wait_blocked("worker.after_claim", 60)
        second = job_of(db, job)
        assert second["percent"] > first["percent"]
        wait_for(browser, lambda: text_of(browser, f"{row} .percent") == f"{second['percent']:.1f}%",
                 30, f"job {job} at {second['percent']:.1f}% without a reload")
        assert browser.execute_script("return window.stillTheSamePage") is True
        assert "1 succeeded" in text_of(browser, f"{row} .subtasks")
        screenshot(browser, "dashboard.png")

        # One job's page: its events and its subtasks, by state.
        browser.find_element(By.CSS_SELECTOR, f"{row} a").click()
        wait_for(browser, lambda: "Events" in browser.page_source and text_of(browser, "#events"),
                 30, "the job's page")
        events = text_of(browser, "#events")
        assert "submitted" in events and "running" in events
        states = texts_of(browser, "#subtasks tbody .state")
        total = scalar(db, "SELECT subtasks_total FROM {s}.jobs WHERE id = :j", j=job)
        assert len(states) == total >= 3
        assert states.count("succeeded") == 1 and states.count("running") == 1
        assert "w1" in text_of(browser, "#subtasks")

        # No token, then a wrong one: refused on the page, nothing changed.
        before = _events(db, job)
        browser.find_element(By.ID, "pause").click()
        wait_for(browser, lambda: "enter the dashboard's token" in text_of(browser, "#message"),
                 30, "the refusal of a missing token")
        browser.find_element(By.ID, "token").send_keys("not-the-token")
        browser.find_element(By.ID, "pause").click()
        wait_for(browser, lambda: "wrong token" in text_of(browser, "#message"), 30,
                 "the refusal of a wrong token")
        assert job_of(db, job)["state"] == "running" and _events(db, job) == before

        # The right token pauses the job: on the page and in the database,
        # with the dashboard's user as the actor of its event.
        token = browser.find_element(By.ID, "token")
        token.clear()
        token.send_keys(TOKEN)
        browser.find_element(By.ID, "pause").click()
        wait_for(browser, lambda: "pause requested" in text_of(browser, "#message"), 30,
                 "the pause accepted")
        workers.gates.release("worker.after_claim")  # the held slot sees the pause and lets go
        wait_for(browser, lambda: text_of(browser, "#summary .state") == "paused", 60,
                 "the job paused on the page")
        assert job_of(db, job)["state"] == "paused"
        assert ("dashboard:127.0.0.1", "pausing") in _events(db, job)
        wait_for(browser, lambda: "dashboard:127.0.0.1" in text_of(browser, "#events"), 30,
                 "the pause event on the page")
        screenshot(browser, "dashboard-job.png")

        # Resume: the job runs to its end, and the page follows it there.
        browser.find_element(By.ID, "resume").click()
        wait_for(browser, lambda: "resume requested" in text_of(browser, "#message"), 30,
                 "the resume accepted")
        wait_for(browser, lambda: text_of(browser, "#summary .state") == "succeeded", 60,
                 "the job succeeded on the page")
        assert text_of(browser, "#summary .percent") == "100.0%"
        assert ("dashboard:127.0.0.1", "resuming") in _events(db, job)


def test_read_only_without_a_token_and_bad_options(db: Database, migrated_db: str) -> None:
    make_items(db, 100)
    job = submit(db, fill("md5(b)")).job_id
    before = _events(db, job)
    # The test server trusts local connections: a password in the URL is
    # accepted, and must show nowhere.
    with_password = make_url(migrated_db).set(password=PASSWORD).render_as_string(
        hide_password=False)
    with running_dashboard(with_password) as dash, chromium() as browser:
        browser.get(f"{dash.base}/jobs/{job}")
        wait_for(browser, lambda: "read-only" in text_of(browser, "#mode"), 30, "read-only note")
        assert PASSWORD not in browser.page_source
        assert text_of(browser, "#summary .state") == "queued"
        assert not browser.find_elements(By.ID, "pause")
        # A POST as a script would send it: refused, nothing changed.
        status, body = post(f"{dash.base}/jobs/{job}/cancel", f"token={TOKEN}")
        assert status == 403 and "read-only" in body
        assert job_of(db, job)["state"] == "queued" and _events(db, job) == before

        # Bad options: one line, exit 2, and the running dashboard unharmed.
        taken = reorg(migrated_db, "dashboard", "--port", str(dash.port))
        assert "cannot listen" in assert_one_error_line(taken, 2)
        assert "--port" in assert_one_error_line(
            reorg(migrated_db, "dashboard", "--port", "70000"), 2)
        unreachable = reorg("postgresql://x@127.0.0.1:1/x", "dashboard", "--port", "1")
        assert_one_error_line(unreachable, 5)
        with urllib.request.urlopen(dash.base + "/", timeout=5) as response:
            assert response.status == 200

        # Ctrl-C is how it stops: exit 0, after saying where it was and how.
        dash.proc.send_signal(signal.SIGINT)
        assert dash.proc.wait(10) == 0, dash.output()
        out = dash.output()
        assert f"reorg dashboard at http://127.0.0.1:{dash.port}/ (read-only)" in out
        assert "Traceback" not in out and PASSWORD not in out


def test_a_job_of_100000_subtasks_pages_fast(db: Database, migrated_db: str) -> None:
    make_items(db, 10)
    job = submit(db, fill("md5(b)")).job_id
    # Half done: 50,000 subtasks moved to history, 50,000 pending. A split that
    # large takes the owner minutes; written directly instead.
    for table, state, ordinals in (("background_subtask_history", "succeeded", (0, 49_999)),
                                   ("background_subtask", "pending", (50_000, 99_999))):
        execute(db, f"""
            INSERT INTO reorg.{table} (id, job_id, step, ordinal, state, start_key, end_key,
                                       curr_key, row_count, meta)
            SELECT nextval('reorg.subtask_id_seq'), :j, 1, g, :state, to_jsonb(g * 10),
                   to_jsonb(g * 10 + 10),
                   to_jsonb(g * 10 + CASE WHEN :state = 'succeeded' THEN 10 ELSE 0 END),
                   CASE WHEN :state = 'succeeded' THEN 10 ELSE 0 END, '{{}}'
            FROM generate_series(:lo, :hi) g""",
                {"j": job, "state": state, "lo": ordinals[0], "hi": ordinals[1]})
        execute(db, f"ANALYZE reorg.{table}")
    execute(db, "UPDATE reorg.jobs SET subtasks_total = 100000, moved_succeeded = 50000, "
                "moved_rows = 500000 WHERE id = :j", {"j": job})
    with running_dashboard(migrated_db) as dash, chromium() as browser:
        for path in (f"/jobs/{job}", f"/jobs/{job}?after=1.49990", f"/jobs/{job}?after=1.99000",
                     f"/jobs/{job}?state=pending", f"/jobs/{job}/fragments/subtasks", "/"):
            started = time.monotonic()
            with urllib.request.urlopen(dash.base + path, timeout=10) as response:
                assert response.status == 200
            # Generous for a shared 2-core machine; reading every subtask is far slower.
            assert time.monotonic() - started < 1.0, path
        browser.get(f"{dash.base}/jobs/{job}")
        wait_for(browser, lambda: "50,000 pending" in text_of(browser, "#summary"), 30,
                 "the subtask counts")
        assert "50,000 succeeded" in text_of(browser, "#summary")
        assert len(texts_of(browser, "#subtasks tbody tr")) == 50
        browser.find_element(By.ID, "next-page").click()
        wait_for(browser, lambda: "after=1.49" in browser.current_url, 30, "the second page")
        assert texts_of(browser, "#subtasks tbody tr td:nth-child(2)") == [
            str(n) for n in range(50, 100)]
        # Where history ends and the live table begins, one page holds both.
        browser.get(f"{dash.base}/jobs/{job}?after=1.49990")
        wait_for(browser, lambda: texts_of(browser, "#subtasks tbody tr td:nth-child(2)") == [
            str(n) for n in range(49_991, 50_041)], 30, "the page across the history boundary")
        states = texts_of(browser, "#subtasks tbody .state")
        assert states == ["succeeded"] * 9 + ["pending"] * 41
        # Filtered by state: only the pending ones, from the first of them.
        browser.find_element(By.LINK_TEXT, "pending").click()
        wait_for(browser, lambda: "state=pending" in browser.current_url, 30, "the filter")
        assert texts_of(browser, "#subtasks tbody tr td:nth-child(2)")[:2] == ["50000", "50001"]
        assert set(texts_of(browser, "#subtasks tbody .state")) == {"pending"}


def test_the_step_of_a_job_of_several_steps_shows_by_name_with_its_percent(
        db: Database, migrated_db: str, start_node) -> None:
    make_items(db, 1_000)
    job = submit(db, fill("md5(b)", steps=True, rows_per_subtask=100, batch_rows=50)).job_id
    # The fill step runs; its first verify batch holds (armed while the owner's
    # transaction entering verify is open, so none ran before).
    faults.arm("owner.after_next_step", "block")
    start_node("n1", slots=1)
    faults.wait_blocked("owner.after_next_step", 60)
    faults.arm("worker.after_batch", "block")
    faults.release("owner.after_next_step")
    faults.wait_blocked("worker.after_batch", 30)
    shown = job_of(db, job)
    label = f"verify 2/3 ({shown['step_percent']:.1f}%) write-reorg"
    with running_dashboard(migrated_db) as dash:
        for page in ("/", f"/jobs/{job}"):
            with urllib.request.urlopen(dash.base + page, timeout=10) as response:
                assert label in response.read().decode(), page
