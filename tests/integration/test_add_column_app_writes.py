"""``add-column`` never undoes the application's own writes of the new
column (DESIGN 9, 14; issue 22 item 1). The column is the application's to
write from prepare on: a value it gives (an INSERT with the column, an
UPDATE that changes it or names it in its SET list) stays, whether the
backfill has passed the row yet or not, through later updates of other
columns, through a move of the row to another key, and through the race of
an explicit NULL with the batch that covers the row. Rows the application
never wrote the column of get ``--value``.

The job is held between two batches (``worker.after_batch``) while the
application writes, so each write lands on a row already filled or not yet
reached, as the test chooses; the race is made exact by an application
transaction the next batch has to wait for."""

from __future__ import annotations

import random
import threading
import uuid

import psycopg
import pytest
from support import job_of, make_items, rows, wait_state, wait_until
from support.app_model import shape

from framework import faults
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 20_000


def _run(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _blocked_by(url: str, pid: int) -> bool:
    """Whether a session waits for a lock that backend ``pid`` holds."""
    with psycopg.connect(url, autocommit=True) as conn:
        return bool(conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (pid,)).fetchone()[0])


class ColumnWriter:
    """An application writing the new column of random rows of [lo, hi) (true,
    false or NULL) and renaming others, while the job runs; ``owned``: what each
    row whose column it wrote must hold at the end."""

    def __init__(self, url: str, lo: int, hi: int) -> None:
        self.url, self.lo, self.hi = url, lo, hi
        self.owned: dict[int, bool | None] = {}
        self.writes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        pick = random.Random(22)
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                key = pick.randrange(self.lo, self.hi)
                try:
                    if pick.random() < 0.5:
                        value = pick.choice([True, False, None])
                        conn.execute("UPDATE items SET verified = %s WHERE id = %s",
                                     (value, key))
                        self.owned[key] = value
                    else:
                        conn.execute("UPDATE items SET b = b || '.' WHERE id = %s", (key,))
                    self.writes += 1
                except psycopg.Error as exc:
                    self.errors.append(str(exc))


def test_the_applications_writes_of_the_new_column_are_never_undone(db, settings, start_node):
    url = settings.database_url
    make_items(url, ROWS)
    _run(url, "DELETE FROM items WHERE id = 15000")  # a free key to move a row to
    faults.arm("worker.after_batch", "block")
    job_id = submit(db, SubmitRequest(
        "add-column", {"table": "items", "column": "verified:boolean", "value": "false"},
        batch_rows=500, rows_per_subtask=ROWS)).job_id
    start_node("n1", slots=1)
    faults.wait_blocked("worker.after_batch", 60)
    # Held after the first batch: [1, 501) is filled, the rest is not.
    assert rows(db, "SELECT id, verified FROM items WHERE id IN (5, 19990) ORDER BY id") == [
        (5, False), (19990, None)]
    _run(url,
         # The repro: a filled row, then another column of it updated.
         "UPDATE items SET verified = true WHERE id = 5",
         "UPDATE items SET b = 'x' WHERE id = 5",
         # A row the backfill has not reached.
         "UPDATE items SET verified = true WHERE id = 19990",
         # A new row that gives the column; one that gives NULL (= not given).
         "INSERT INTO items (id, b, verified) VALUES (30001, 'new', true)",
         "INSERT INTO items (id, b, verified) VALUES (30002, 'new', NULL)",
         # Explicit NULLs: on a filled row (then renamed), on a row not reached.
         "UPDATE items SET verified = NULL WHERE id = 6",
         "UPDATE items SET b = 'y' WHERE id = 6",
         "UPDATE items SET verified = NULL WHERE id = 19991",
         # A filled row given true, then moved to a key not reached, then renamed.
         "UPDATE items SET verified = true WHERE id = 7",
         "UPDATE items SET id = 15000 WHERE id = 7",
         "UPDATE items SET b = 'z' WHERE id = 15000",
         # A row not reached given true, moved past every range, renamed.
         "UPDATE items SET verified = true WHERE id = 19000",
         "UPDATE items SET id = 40000 WHERE id = 19000",
         "UPDATE items SET b = 'w' WHERE id = 40000")
    # The race: an explicit NULL committed while the next batch (over
    # [501, 1001)) waits for the row's lock, after the batch's snapshot.
    with psycopg.connect(url) as app:
        app.execute("UPDATE items SET verified = NULL WHERE id = 600")
        faults.release("worker.after_batch")
        wait_until(lambda: _blocked_by(url, app.info.backend_pid), 30,
                   "the batch waiting for row 600")
        app.commit()
    writer = ColumnWriter(url, 2_000, 14_000)
    writer.start()
    wait_until(lambda: writer.writes >= 50 or job_of(db, job_id)["state"] == "succeeded", 60,
               "the application's writes during the job")
    done = wait_state(db, job_id)
    writer.stop()
    assert done["state"] == "succeeded", done["error"]
    assert writer.errors == []
    table = dict(rows(db, "SELECT id, verified FROM items"))
    named = {5: True, 19990: True, 30001: True, 30002: False, 6: None, 19991: None,
             15000: True, 40000: True, 600: None}
    assert {key: table.get(key, "missing") for key in named} == named
    expected = {key: False for key in range(1, ROWS + 1)}
    expected.update(writer.owned)
    del expected[7], expected[19000]
    expected.update(named)
    wrong = {key: (table.get(key, "missing"), value) for key, value in expected.items()
             if table.get(key, "missing") is not value}
    assert not wrong, f"{len(wrong)} rows (found, expected): {dict(sorted(wrong.items())[:8])}"
    assert set(table) == set(expected)
    assert rows(db, "SELECT b FROM items WHERE id IN (5, 6, 15000, 40000) ORDER BY id") == [
        ("x",), ("y",), ("z",), ("w",)]
    left = shape(db.engine)  # the cut-over dropped every trigger, function and work table
    assert (left["triggers"], left["functions"], left["work_tables"]) == ([], [], [])


def test_an_application_role_without_access_to_reorgs_schema_writes_through_the_triggers(
        db, settings, start_node):
    """The triggers book ownership in reorg's schema on behalf of whoever
    writes the table: an application role with no privilege there writes
    as before, and its writes of the column stay."""
    url = settings.database_url
    make_items(url, 2_000)
    role = f"app_{uuid.uuid4().hex[:8]}"
    _run(url, f"CREATE ROLE {role}", f"GRANT SELECT, INSERT, UPDATE, DELETE ON items TO {role}")
    try:
        faults.arm("worker.after_batch", "block")
        job_id = submit(db, SubmitRequest(
            "add-column", {"table": "items", "column": "verified:boolean", "value": "false"},
            batch_rows=500, rows_per_subtask=2_000)).job_id
        start_node("n1", slots=1)
        faults.wait_blocked("worker.after_batch", 60)
        with psycopg.connect(url, autocommit=True) as app:
            app.execute(f"SET ROLE {role}")
            assert not app.execute("SELECT has_schema_privilege('reorg', 'USAGE')").fetchone()[0]
            for statement in ("UPDATE items SET verified = true WHERE id = 5",
                              "UPDATE items SET b = 'x' WHERE id = 5",
                              "UPDATE items SET verified = NULL WHERE id = 1500",
                              "INSERT INTO items (id, b, verified) VALUES (5000, 'n', true)",
                              "INSERT INTO items (id, b) VALUES (5001, 'n')",
                              "UPDATE items SET id = 7000 WHERE id = 5",
                              "DELETE FROM items WHERE id = 6"):
                app.execute(statement)
        faults.release("worker.after_batch")
        done = wait_state(db, job_id)
        assert done["state"] == "succeeded", done["error"]
        assert rows(db, "SELECT id, verified FROM items WHERE verified IS NOT false "
                        "OR id IN (6, 5001) ORDER BY id") == [(1500, None), (5000, True),
                                                              (5001, False), (7000, True)]
    finally:
        _run(url, f"DROP OWNED BY {role}", f"DROP ROLE {role}")
