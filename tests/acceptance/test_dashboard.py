"""``reorg dashboard`` as a person sees it: the command run as a subprocess
against a real PostgreSQL, real workers running jobs held mid-way by fault
blocks, and a real headless Chromium, 1,280 px wide, reading the page.

One dashboard (with a token) and one Chromium serve the module, on one
database whose system tables start empty for each test.

Screenshots, under tests/artifacts/ (each test prints the path):
dashboard.png (jobs and nodes), dashboard-job.png (a job paused from the
page), dashboard-alter.png (a job paused on a failure, altered from the
page), dashboard-jobs-1280.png and dashboard-job-1280.png (the jobs page and
a job's whole page with long parameters and its rows/s chart)."""

from __future__ import annotations

import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from cli_support import assert_one_error_line, reorg, reorg_json
from cli_support import submit as submit_sql_update
from dashboard_support import (
    Dashboard,
    assert_no_horizontal_overflow,
    chromium,
    click,
    get_json,
    post,
    running_dashboard,
    screenshot,
    text_of,
    texts_of,
    wait_for,
)
from selenium import webdriver
from selenium.webdriver.common.by import By
from sqlalchemy.engine import make_url
from support import (
    create_database,
    database_url,
    drop_database,
    execute,
    fill,
    job_of,
    make_items,
    scalar,
    wait_state,
)
from support.processes import Workers

from framework import faults
from framework.db import Database, describe_url
from framework.durations import duration
from framework.store import jobs
from framework.submit import submit

TOKEN = "s3cret-token"
PASSWORD = "pw-never-shown"
# One slot; its first batch commits and it waits (25 % of nothing yet: 500 of
# 4,000 rows); once released it finishes that subtask and waits again right
# after claiming the second: a job held mid-way twice, at two percents.
HOLD = "worker.after_batch=block@1,worker.after_claim=block@2"
LOCAL = "dashboard:127.0.0.1"
SYSTEM_TABLES = ("job_events", "background_subtask", "background_subtask_history",
                 "job_progress_sample", "job_split_pending", "jobs", "nodes")


@pytest.fixture(scope="module")
def migrated_db(pg_server: str, migrated_template: str) -> Iterator[str]:
    """The module's database (the per-test ``migrated_db`` overridden), so
    one dashboard serves every test."""
    name = f"t_dashboard_{uuid.uuid4().hex[:8]}"
    create_database(pg_server, name, template=migrated_template)
    try:
        yield database_url(pg_server, name)
    finally:
        drop_database(pg_server, name)


@pytest.fixture(autouse=True)
def _empty_system_tables(migrated_db: str) -> None:
    """Each test starts on empty system tables, as on a database of its own:
    no job, event, subtask or node of an earlier test, and no owner lease
    held by an earlier test's killed worker. (Job ids go on rising, so a
    page still open on an earlier job cannot show a new one.)"""
    # The dashboard's page reads these tables in its own order while the
    # TRUNCATE locks them one by one: PostgreSQL may pick the TRUNCATE as a
    # deadlock's victim; the page only misses one refresh, so go again.
    deadline = time.monotonic() + 30
    while True:
        try:
            execute(migrated_db, f"TRUNCATE {', '.join('reorg.' + t for t in SYSTEM_TABLES)}; "
                                 "UPDATE reorg.owner_lease SET expires_at = clock_timestamp()")
            return
        except psycopg.errors.DeadlockDetected:
            if time.monotonic() > deadline:
                raise


@pytest.fixture(scope="module")
def dash(migrated_db: str) -> Iterator[Dashboard]:
    with running_dashboard(migrated_db, REORG_DASHBOARD_TOKEN=TOKEN) as dashboard:
        yield dashboard


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium() as chrome:
        yield chrome


def _fetch(url: str) -> str:
    """What the server answers at ``url`` now: its status and the start of its text."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return f"{response.status} {response.read().decode()[:300]!r}"
    except Exception as error:  # noqa: BLE001 - said in a failure message
        return f"{type(error).__name__}: {error}"


def _events(db: Database, job_id: int) -> list[tuple[str, str]]:
    return [(actor, to) for actor, to in execute(
        db, "SELECT actor, to_state FROM reorg.job_events WHERE job_id = :j ORDER BY id",
        {"j": job_id})]


def _job_row(db: Database, job_id: int) -> list[tuple]:
    """The job's row and its events, to show that a refused request changed nothing."""
    return execute(db, "SELECT to_jsonb(j) - 'updated_at' FROM reorg.jobs j WHERE id = :j",
                   {"j": job_id}) + execute(
        db, "SELECT actor, from_state, to_state, detail FROM reorg.job_events "
            "WHERE job_id = :j ORDER BY id", {"j": job_id})


def _use_token(browser: webdriver.Chrome, value: str) -> None:
    field = browser.find_element(By.ID, "token")
    field.clear()
    if value:
        field.send_keys(value)


def _alter(browser: webdriver.Chrome, **fields: str) -> None:
    """Fill in the alter form (other fields left empty) and send it."""
    for name in ("batch_rows", "max_rows_per_sec", "concurrency", "max_replica_lag",
                 "max_active_sessions"):
        box = browser.find_element(By.ID, f"alter-{name}")
        box.clear()
        if name in fields:
            box.send_keys(fields[name])
    browser.execute_script("document.getElementById('message').textContent = ''")
    click(browser, By.ID, "alter-submit")


def _message(browser: webdriver.Chrome, what: str) -> str:
    wait_for(browser, lambda: text_of(browser, "#message"), 30, what)
    return text_of(browser, "#message")


def test_live_progress_events_subtasks_pause_and_resume_with_the_token(
        db: Database, migrated_db: str, workers: Workers, dash: Dashboard,
        browser: webdriver.Chrome) -> None:
    make_items(db, 4_000)
    job = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=500)).job_id
    workers.start("w1", slots=1, faults=HOLD)
    assert workers.gates is not None
    workers.gates.wait_blocked("worker.after_batch", 60)
    first = job_of(db, job)
    assert first["state"] == "running" and first["percent"] > 0

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
    click(browser, By.CSS_SELECTOR, f"{row} a")
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
    click(browser, By.ID, "pause")
    wait_for(browser, lambda: "enter the dashboard's token" in text_of(browser, "#message"),
             30, "the refusal of a missing token")
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    click(browser, By.ID, "pause")
    wait_for(browser, lambda: "wrong token" in text_of(browser, "#message"), 30,
             "the refusal of a wrong token")
    assert job_of(db, job)["state"] == "running" and _events(db, job) == before

    # The right token pauses the job: on the page and in the database,
    # with the dashboard's user as the actor of its event.
    token = browser.find_element(By.ID, "token")
    token.clear()
    token.send_keys(TOKEN)
    click(browser, By.ID, "pause")
    wait_for(browser, lambda: "pause requested" in text_of(browser, "#message"), 30,
             "the pause accepted")
    workers.gates.release("worker.after_claim")  # the held slot sees the pause and lets go
    wait_for(browser, lambda: text_of(browser, "#summary .state") == "paused", 60,
             "the job paused on the page")
    assert job_of(db, job)["state"] == "paused"
    assert (LOCAL, "pausing") in _events(db, job)
    wait_for(browser, lambda: LOCAL in text_of(browser, "#events"), 30,
             "the pause event on the page")
    screenshot(browser, "dashboard-job.png")

    # Resume: the job runs to its end, and the page follows it there.
    click(browser, By.ID, "resume")
    wait_for(browser, lambda: "resume requested" in text_of(browser, "#message"), 30,
             "the resume accepted")
    wait_for(browser, lambda: text_of(browser, "#summary .state") == "succeeded", 60,
             "the job succeeded on the page")
    assert text_of(browser, "#summary .percent") == "100.0%"
    assert (LOCAL, "resuming") in _events(db, job)


def test_read_only_without_a_token_and_bad_options(
        db: Database, migrated_db: str, browser: webdriver.Chrome) -> None:
    make_items(db, 100)
    job = submit(db, fill("md5(b)")).job_id
    before = _events(db, job)
    # The test server trusts local connections: a password in the URL is
    # accepted, and must show nowhere.
    with_password = make_url(migrated_db).set(password=PASSWORD).render_as_string(
        hide_password=False)
    with running_dashboard(with_password) as dash:
        browser.get(f"{dash.base}/jobs/{job}")
        wait_for(browser, lambda: "read-only" in text_of(browser, "#mode"), 30, "read-only note")
        assert PASSWORD not in browser.page_source
        assert text_of(browser, "#summary .state") == "queued"
        assert not browser.find_elements(By.ID, "pause")
        # A POST as a script would send it: refused, nothing changed.
        for action, form in (("cancel", ""), ("retry", ""), ("alter", "&batch_rows=5")):
            status, body = post(f"{dash.base}/jobs/{job}/{action}", f"token={TOKEN}{form}")
            assert status == 403 and "read-only" in body, action
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


def test_a_job_of_100000_subtasks_pages(
        db: Database, dash: Dashboard, browser: webdriver.Chrome) -> None:
    make_items(db, 10)
    job = submit(db, fill("md5(b)")).job_id
    # Half done in an hour: 50,000 subtasks moved to history (one every
    # 72 ms, whose rows the rows/s chart reads), 50,000 pending. A split that
    # large takes the owner minutes; written directly instead.
    [(an_hour_ago,)] = execute(db, "SELECT now() - interval '1 hour'")
    for table, state, ordinals in (("background_subtask_history", "succeeded", (0, 49_999)),
                                   ("background_subtask", "pending", (50_000, 99_999))):
        execute(db, f"""
            INSERT INTO reorg.{table} (id, job_id, step, ordinal, state, start_key, end_key,
                                       curr_key, row_count, meta, started_at, finished_at)
            SELECT nextval('reorg.subtask_id_seq'), :j, 1, g, :state, to_jsonb(g * 10),
                   to_jsonb(g * 10 + 10),
                   to_jsonb(g * 10 + CASE WHEN :state = 'succeeded' THEN 10 ELSE 0 END),
                   CASE WHEN :state = 'succeeded' THEN 10 ELSE 0 END, '{{}}',
                   CASE WHEN :state = 'succeeded' THEN :t0 + g * interval '72 ms' END,
                   CASE WHEN :state = 'succeeded' THEN :t0 + (g + 1) * interval '72 ms' END
            FROM generate_series(:lo, :hi) g""",
                {"j": job, "state": state, "lo": ordinals[0], "hi": ordinals[1],
                 "t0": an_hour_ago})
        execute(db, f"ANALYZE reorg.{table}")
    execute(db, "UPDATE reorg.jobs SET subtasks_total = 100000, moved_succeeded = 50000, "
                "moved_rows = 500000, state = 'running', step = 1, started_at = :t0 "
                "WHERE id = :j", {"j": job, "t0": an_hour_ago})
    for path in (f"/jobs/{job}", f"/jobs/{job}?after=1.49990", f"/jobs/{job}?after=1.99000",
                 f"/jobs/{job}?state=pending", f"/jobs/{job}/fragments/subtasks",
                 f"/jobs/{job}/fragments/chart", f"/api/jobs/{job}", "/api/jobs", "/"):
        # Each page answers (its speed is not asserted here: a timed assertion
        # fails on a loaded machine; the pages read by key, never every subtask).
        with urllib.request.urlopen(dash.base + path, timeout=10) as response:
            assert response.status == 200, path
    browser.get(f"{dash.base}/jobs/{job}")
    wait_for(browser, lambda: "50,000 pending" in text_of(browser, "#summary"), 30,
             "the subtask counts")
    assert "50,000 succeeded" in text_of(browser, "#summary")
    # Its rows/s over the hour and the seconds since, from the 50,000
    # subtasks' rows and times: 10 rows every 72 ms in every bar but the
    # last (the seconds since have none); together, every row.
    bars = browser.execute_script(
        "return [...document.querySelectorAll('#chart svg rect')].map("
        "r => [parseFloat(r.dataset.rows), parseFloat(r.dataset.rate)])")
    assert len(bars) == 60 and abs(sum(rows for rows, _ in bars) - 500_000) < 1
    assert all(rate == pytest.approx(10 / 0.072, rel=0.01) for _, rate in bars[:-1]), bars
    assert 0 < bars[-1][1] <= 10 / 0.072 + 0.1
    assert len(texts_of(browser, "#subtasks tbody tr")) == 50
    click(browser, By.ID, "next-page")
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
    click(browser, By.LINK_TEXT, "pending")
    wait_for(browser, lambda: "state=pending" in browser.current_url, 30, "the filter")
    assert texts_of(browser, "#subtasks tbody tr td:nth-child(2)")[:2] == ["50000", "50001"]
    assert set(texts_of(browser, "#subtasks tbody .state")) == {"pending"}


def test_the_step_of_a_job_of_several_steps_shows_by_name_with_its_percent(
        db: Database, start_node, dash: Dashboard) -> None:
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
    for page in ("/", f"/jobs/{job}"):
        with urllib.request.urlopen(dash.base + page, timeout=10) as response:
            assert label in response.read().decode(), page


def test_retry_and_alter_from_the_job_page(
        db: Database, workers: Workers, dash: Dashboard, browser: webdriver.Chrome) -> None:
    make_items(db, 2_000)
    # 1 / a fails (division by zero) on one row until the test fixes it.
    execute(db, "UPDATE items SET a = 1; UPDATE items SET a = 0 WHERE id = 1500")
    job = submit(db, fill("md5(b) || repeat('x', 1 / a - 1)", rows_per_subtask=500,
                          batch_rows=100, concurrency=1, on_failure="pause")).job_id
    workers.start("w1", slots=1, REORG_MAX_ATTEMPTS="1")
    wait_state(db, job, {"paused"}, timeout=60)

    browser.get(f"{dash.base}/jobs/{job}")
    wait_for(browser, lambda: text_of(browser, "#summary .state") == "paused", 30,
             "the job paused on its failure")
    assert "division by zero" in text_of(browser, "#summary .error")
    assert "1 failed" in text_of(browser, "#summary .subtasks")
    assert text_of(browser, "#limit-batch-rows") == "batch rows 100"

    # Refused, each with one line on the page, and nothing changed: no
    # token, a knob that is not a number, one out of range, none at all.
    before = _job_row(db, job)
    for token, fields, expected in (
            ("", {"batch_rows": "200"}, "enter the dashboard's token"),
            ("not-the-token", {"batch_rows": "200"}, "refused: wrong token; nothing was changed"),
            (TOKEN, {"batch_rows": "lots"}, "--batch-rows must be a whole number, got 'lots'"),
            (TOKEN, {"concurrency": "0"}, "--concurrency must be at least 1, got 0"),
            (TOKEN, {"max_replica_lag": "-1"}, "--max-replica-lag must be at least 0"),
            (TOKEN, {}, "nothing to change: fill in at least one of")):
        _use_token(browser, token)
        _alter(browser, **fields)
        shown = _message(browser, f"the refusal of {fields or 'an empty form'}")
        assert expected in shown and len(shown.splitlines()) == 1, shown
        assert "refused" in browser.find_element(By.CSS_SELECTOR, "#message p").get_attribute(
            "class")
    assert _job_row(db, job) == before

    # Altered from the page as by `reorg alter`: the job, its event (the
    # dashboard's actor) and the limits on the page.
    _alter(browser, batch_rows="200", max_rows_per_sec="50000", concurrency="2",
           max_replica_lag="30")
    assert _message(browser, "the alter accepted") == (
        f"job {job} altered: batch_rows=200, max_rows_per_sec=50000, concurrency=2, "
        "max_replica_lag=30")
    assert execute(db, "SELECT batch_rows, max_rows_per_sec, concurrency, max_replica_lag "
                       "FROM reorg.jobs WHERE id = :j", {"j": job}) == [(200, 50_000, 2, 30.0)]
    assert execute(db, "SELECT actor, detail FROM reorg.job_events WHERE job_id = :j "
                       "ORDER BY id DESC LIMIT 1", {"j": job}) == [
        (LOCAL, "altered: batch_rows=200, max_rows_per_sec=50000, concurrency=2, "
                "max_replica_lag=30")]
    wait_for(browser, lambda: text_of(browser, "#limit-rows-per-sec") == "max rows/s 50,000", 30,
             "the new limits on the page")
    assert text_of(browser, "#limit-batch-rows") == "batch rows 200"
    assert text_of(browser, "#limit-concurrency") == "concurrency 2"
    assert text_of(browser, "#limit-replica-lag") == "max replica lag 30s"
    assert browser.find_element(By.ID, "alter-batch_rows").get_attribute("value") == ""
    assert_no_horizontal_overflow(browser)
    screenshot(browser, "dashboard-alter.png", whole_page=True)

    # The cause fixed, Retry re-queues the failed subtask and the job
    # resumes from its checkpoint to its end.
    execute(db, "UPDATE items SET a = 1 WHERE id = 1500")
    browser.execute_script("document.getElementById('message').textContent = ''")
    click(browser, By.ID, "retry")
    assert _message(browser, "the retry accepted") == (
        f"job {job}: 1 failed subtasks re-queued; resuming")
    wait_for(browser, lambda: text_of(browser, "#summary .state") == "succeeded", 60,
             "the retried job succeeded on the page")
    assert (LOCAL, "resuming") in _events(db, job)
    assert execute(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == [(0,)]

    # An ended job can be neither retried nor altered: the job's own words.
    before = _job_row(db, job)
    for button, expected in (
            ("retry", f"job {job} is succeeded; only a paused job can be retried"),
            ("alter", f"job {job} already succeeded; only a live job can be altered")):
        if button == "alter":
            _alter(browser, batch_rows="300")
        else:
            browser.execute_script("document.getElementById('message').textContent = ''")
            click(browser, By.ID, "retry")
        assert _message(browser, f"the refused {button}") == expected
    assert _job_row(db, job) == before


LONG_SET = ("c = md5(b) || '|' || coalesce(upper(substr(b, 1, 3)), 'none') || "
            "' password=hunter2 ' || repeat('-', 3) || '|' || "
            + " || ".join(f"'{w}'" for w in ["a-rather-long-literal-for-the-page-to-wrap"] * 4))
LONG_WHERE = ("id BETWEEN 1 AND 1000000000 AND b IS NOT NULL AND "
              + " AND ".join(f"b <> 'some-value-nobody-has-{n}'" for n in range(12)))
LONG_TABLE = "items_with_a_long_name_as_operators_give_them_in_real_life_x"


def test_parameters_submitter_limits_chart_and_the_page_fits_1280_px(
        db: Database, migrated_db: str, workers: Workers, dash: Dashboard,
        browser: webdriver.Chrome) -> None:
    make_items(db, 4_500, table=LONG_TABLE)
    workers.start_cli("w1", "--slots", "2", "--no-spark-warmup")
    job = submit_sql_update(migrated_db, "--table", LONG_TABLE, "--set", LONG_SET,
                            "--where", LONG_WHERE, "--rows-per-subtask", "300",
                            "--batch-rows", "100", "--concurrency", "2",
                            "--max-rows-per-sec", "1500")
    ended = wait_state(db, job, timeout=60)
    assert ended["state"] == "succeeded" and ended["rows_done"] == 4_500, ended
    status = reorg_json(migrated_db, "status", str(job))[0]
    role = make_url(migrated_db).username

    browser.get(f"{dash.base}/jobs/{job}")
    wait_for(browser, lambda: text_of(browser, "#summary .state") == "succeeded", 30,
             "the job's page")
    # Its parameters as given (the password in the SET masked), who
    # submitted it, its limits and its time.
    assert text_of(browser, "#param-set") == LONG_SET.replace("hunter2", "***")
    assert text_of(browser, "#param-where") == LONG_WHERE
    assert "hunter2" not in browser.page_source
    submitted = text_of(browser, "#submitted")
    assert status["submitted_by"] in submitted and "@" in status["submitted_by"]
    assert f"runs as database role {role}" in submitted
    assert text_of(browser, "#summary .limits") == (
        "concurrency 2, batch rows 100, max rows/s 1,500, max replica lag none, "
        "max active sessions none")
    assert text_of(browser, "#summary .elapsed").startswith(
        f"{duration(status['elapsed_seconds'])} since ")

    # The rows/s chart: drawn on the server, each bar the rows of its
    # interval; together they are every row the job wrote, at no more than
    # the limit's pace on average (the limit drawn dashed).
    bars = browser.execute_script(
        "return [...document.querySelectorAll('#chart svg rect')].map("
        "r => [parseFloat(r.dataset.rows), parseFloat(r.dataset.rate)])")
    assert len(bars) >= 2 and sum(1 for rows, _ in bars if rows > 0) >= 2, bars
    assert abs(sum(rows for rows, _ in bars) - 4_500) < 1, bars
    assert browser.find_elements(By.CSS_SELECTOR, "#chart svg line.limit")
    assert "limit 1,500 rows/s (dashed)" in text_of(browser, "#chart")
    assert not browser.execute_script(
        "return [...document.scripts].some(s => s.src && !s.src.startsWith(location.origin))")
    assert_no_horizontal_overflow(browser)
    path = screenshot(browser, "dashboard-job-1280.png", whole_page=True)
    assert path.stat().st_size > 10_000

    # The jobs page fits as well, with a second job on the same long name
    # running slowly, and the nodes.
    second = submit_sql_update(migrated_db, "--table", LONG_TABLE, "--set", "c = upper(c)",
                               "--where", LONG_WHERE, "--max-rows-per-sec", "30")
    # 4,500 rows at 30 rows/s: running for minutes, on a loaded machine too.
    # The database first, so that a failure says which side was late.
    wait_state(db, second, {"running"}, timeout=60)
    browser.get(dash.base + "/")
    try:
        wait_for(browser, lambda: text_of(browser, f"#job-{second} .state") == "running"
                 and "w1" in text_of(browser, "#nodes"), 60, "the second job running")
    except Exception:
        # Short, without a traceback: CI keeps the head of a failure's output.
        pytest.fail(f"the page shows job {second} as "
                    f"{text_of(browser, f'#job-{second} .state')!r} and nodes "
                    f"{text_of(browser, '#nodes')!r}; the database: "
                    f"{job_of(db, second)['state']}; the server's jobs fragment: "
                    f"{_fetch(dash.base + '/fragments/jobs')}; the page's jobs: "
                    f"{text_of(browser, '#jobs')[:300]!r}", pytrace=False)
    assert_no_horizontal_overflow(browser)
    screenshot(browser, "dashboard-jobs-1280.png", whole_page=True)


def test_the_json_api_answers_what_status_and_nodes_json_print(
        db: Database, migrated_db: str, workers: Workers, dash: Dashboard) -> None:
    make_items(db, 1_000)
    worker = workers.start_cli("w1", "--slots", "1", "--no-spark-warmup")
    done = submit_sql_update(migrated_db, "--table", "items", "--set", "c = md5(b)")
    assert wait_state(db, done, timeout=60)["state"] == "succeeded", worker.log()

    # Nodes: the fields of `reorg nodes --json`; the heartbeat's age moves.
    code, kind, nodes = get_json(f"{dash.base}/api/nodes")
    printed = reorg_json(migrated_db, "nodes")
    assert (code, kind) == (200, "application/json")
    assert [set(n) for n in nodes] == [set(n) for n in printed]
    moving = ("heartbeat_age", "heartbeat_at")
    assert [{k: v for k, v in n.items() if k not in moving} for n in nodes] == [
        {k: v for k, v in n.items() if k not in moving} for n in printed]
    assert nodes[0]["node_id"] == "w1" and nodes[0]["is_owner"] is True
    assert isinstance(nodes[0]["owner_revision"], int)

    # With no worker left, a job stays queued; ended or queued, the jobs
    # stand still: the API and `reorg status --json` answer the same.
    worker.signal(signal.SIGTERM)
    worker.proc.wait(30)
    make_items(db, 10, table="other")
    queued = submit(db, fill("md5(b)", table="other", max_rows_per_sec=10)).job_id
    code, kind, listed = get_json(f"{dash.base}/api/jobs")
    assert (code, kind) == (200, "application/json")
    assert listed == reorg_json(migrated_db, "status")
    assert [j["id"] for j in listed] == [queued, done]
    code, _, one = get_json(f"{dash.base}/api/jobs/{done}")
    assert code == 200 and one == reorg_json(migrated_db, "status", str(done))[0]
    assert one["params"]["set"] == "c = md5(b)" and "@" in one["submitted_by"]
    assert one["state"] == "succeeded" and one["rows_done"] == 1_000
    code, _, limited = get_json(f"{dash.base}/api/jobs?limit=1")
    assert code == 200 and [j["id"] for j in limited] == [queued]

    # Read-only, and a clear JSON error for what it cannot answer.
    assert get_json(f"{dash.base}/api/jobs/999999") == (
        404, "application/json",
        {"error": "job 999999 does not exist; `reorg status` lists jobs"})
    code, kind, body = get_json(f"{dash.base}/api/jobs?limit=0")
    assert (code, kind) == (400, "application/json") and "limit='0'" in body["error"]
    assert get_json(f"{dash.base}/api/jobs", method="POST")[0] == 405
    assert get_json(f"{dash.base}/api/jobs/{done}", method="DELETE")[0] == 405
