"""The ``checksum`` job type on a real PostgreSQL (and a real local
SparkSession for ``compare_in = "spark"``): exactly the injected differences
are found, identical tables report nothing, findings are recorded exactly once
with the fenced checkpoint, bad input is rejected, and a job runs through real
in-process nodes with ``report`` summing up its findings."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import TERMINAL, make_items, rows, snapshot, table_rows, wait_state
from support.spark import JobKind, make_context

from backfill.checksum import batches as comparing
from backfill.checksum.batches import ChecksumPipeline, Findings
from backfill.checksum.job import ChecksumJobType, spec_of
from backfill.checksum.report import report
from framework.errors import LeaseLost
from framework.store import history, jobs
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.spark

JT = ChecksumJobType()
CHECKSUM = JobKind(JT, ChecksumPipeline, spec_of, {"target_batch_seconds": 0})
MODES = ["postgres", "spark"]


def run_split(engine, job, cuts: list[int]) -> list[Findings]:
    """The findings of subtasks over [cuts[0], cuts[1]), [cuts[1], cuts[2]), ... as
    the owner's split would make them (the first starts at the source's smallest
    key, the last ends just past its largest)."""
    return [p.findings for p in CHECKSUM.run_split(engine, job, cuts)]


def found(findings: list[Findings]) -> list[list]:
    return sorted(k for f in findings for k in f.keys)


def make_pair(engine, n: int = 6_000) -> None:
    """items and items_copy, equal: n rows, keys 10, 20, ... (room around them)."""
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS items, items_copy"))
        conn.execute(sa.text("CREATE TABLE items (id bigint PRIMARY KEY, a int, b text, c text)"))
        conn.execute(sa.text(
            "INSERT INTO items SELECT g * 10, g % 97, 'v' || g, "
            "CASE WHEN g % 4 = 0 THEN NULL ELSE md5('v' || g) END FROM generate_series(1, :n) g"),
            {"n": n})
        conn.execute(sa.text("CREATE TABLE items_copy AS SELECT * FROM items"))
        conn.execute(sa.text("ALTER TABLE items_copy ADD PRIMARY KEY (id)"))


CUTS = [10, 20_010, 40_010, 60_001]  # three subtasks over keys 10 .. 60,000


@pytest.mark.parametrize("mode", MODES)
def test_identical_tables_report_nothing(spark, target_db, mode):
    make_pair(target_db)
    job = CHECKSUM.submit(target_db, 301, {"table": "items", "target": "items_copy",
                                           "compare_in": mode})
    findings = run_split(target_db, job, CUTS)
    assert [f.mismatches for f in findings] == [0, 0, 0]
    assert found(findings) == []


@pytest.mark.parametrize("mode", MODES)
def test_finds_exactly_the_injected_differences(spark, target_db, mode):
    make_pair(target_db)
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items_copy SET b = b || 'x' WHERE id = 100"))  # changed
        conn.execute(sa.text("UPDATE items_copy SET c = NULL WHERE id = 30010"))  # value -> NULL
        conn.execute(sa.text("UPDATE items_copy SET c = 'now set' WHERE id = 40"))  # NULL -> value
        conn.execute(sa.text("UPDATE items_copy SET a = NULL, b = a::text WHERE id = 50"))
        conn.execute(sa.text("DELETE FROM items_copy WHERE id IN (20, 20010, 60000)"))  # missing
        conn.execute(sa.text("DELETE FROM items WHERE id = 45000"))  # only in the copy
        # Only in the copy, beyond the source's key span on both sides and between its keys.
        conn.execute(sa.text("INSERT INTO items_copy (id, a, b) VALUES (-5, 1, 'x'), (3, 1, 'x'), "
                             "(45001, 1, 'x'), (60001, 1, 'x'), (99999999, 1, 'x')"))
    expected = sorted([[100, "different"], [30010, "different"], [40, "different"],
                       [50, "different"], [20, "missing_in_target"],
                       [20010, "missing_in_target"], [60000, "missing_in_target"],
                       [45000, "missing_in_source"], [-5, "missing_in_source"],
                       [3, "missing_in_source"], [45001, "missing_in_source"],
                       [60001, "missing_in_source"], [99999999, "missing_in_source"]])
    before = snapshot(target_db), snapshot(target_db, "items_copy")
    job = CHECKSUM.submit(target_db, 302, {"table": "items", "target": "items_copy",
                                           "compare_in": mode})
    findings = run_split(target_db, job, CUTS)
    assert found(findings) == expected
    assert sum(f.counts["missing_in_source"] for f in findings) == 6
    assert sum(f.counts["missing_in_target"] for f in findings) == 3
    assert sum(f.counts["different"] for f in findings) == 4
    # The head (keys below 10) belongs to the first subtask, the tail to the last.
    assert findings[0].ranges[0][0] is None and findings[2].ranges[-1][1] is None
    assert all(r[0] is not None and r[1] is not None for r in findings[1].ranges)
    # Read-only: both tables as they were.
    assert (snapshot(target_db), snapshot(target_db, "items_copy")) == before


@pytest.mark.parametrize("mode", MODES)
def test_columns_subset_and_comparable_types(spark, target_db, mode):
    make_pair(target_db, 2_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("ALTER TABLE items_copy ALTER COLUMN a TYPE bigint, "
                             "ALTER COLUMN b TYPE varchar(40)"))
        conn.execute(sa.text("UPDATE items_copy SET c = 'differs' WHERE id = 500"))
    job = CHECKSUM.submit(target_db, 303, {"table": "items", "target": "items_copy",
                                           "columns": ["a,b"], "compare_in": mode})
    assert job.params["columns"] == [{"name": "a", "common": "bigint"},
                                     {"name": "b", "common": "text"}]
    assert found(run_split(target_db, job, [10, 20_001])) == []
    job = CHECKSUM.submit(target_db, 304, {"table": "items", "target": "items_copy",
                                           "compare_in": mode})
    assert found(run_split(target_db, job, [10, 20_001])) == [[500, "different"]]


def test_counts_every_mismatch_but_records_a_capped_number_of_keys(spark, target_db,
                                                                   monkeypatch):
    monkeypatch.setattr(comparing, "MAX_KEYS", 25)
    make_pair(target_db, 3_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items_copy SET b = 'x' WHERE id % 30 = 0"))  # 1,000 rows
    job = CHECKSUM.submit(target_db, 305, {"table": "items", "target": "items_copy"}, batch_rows=400)
    findings = run_split(target_db, job, [10, 30_001])[0]
    assert findings.mismatches == 1_000 and len(findings.keys) == 25
    assert findings.keys == [[k, "different"] for k in range(30, 30 * 26, 30)]
    # Adjacent mismatching batches make one range.
    assert [r[2] for r in findings.ranges] == [1_000]


@pytest.mark.parametrize("mode", MODES)
def test_findings_are_recorded_exactly_once_across_a_lost_lease(spark, target_db, mode):
    make_pair(target_db, 4_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items_copy SET b = 'x' WHERE id % 70 = 0"))
    expected = rows(target_db, "SELECT id FROM items WHERE id % 70 = 0 ORDER BY id")
    job = CHECKSUM.submit(target_db, 306, {"table": "items", "target": "items_copy",
                                           "compare_in": mode}, batch_rows=500)
    ctx, lease = make_context(target_db, job, 1, 10, 40_001, revoke_at=3)
    with pytest.raises(LeaseLost):
        ChecksumPipeline(ctx, target_db, spec_of(job)).run()
    committed = lease.row()
    assert committed.curr_key == lease.attempts[1]
    # A new claim resumes from the committed curr_key with the committed meta.
    ctx, lease = make_context(target_db, job, 1, 10, 40_001, curr_key=committed.curr_key,
                              epoch=2)
    ctx.meta = dict(committed.meta)
    pipeline = ChecksumPipeline(ctx, target_db, spec_of(job))
    pipeline.run()
    assert pipeline.findings.mismatches == len(expected)
    assert [k for k, _ in pipeline.findings.keys] == [r[0] for r in expected]
    assert lease.row().meta["checksum"]["mismatches"] == len(expected)


def test_spark_candidates_are_confirmed_in_one_snapshot(spark, target_db, monkeypatch):
    """The two Spark reads are two snapshots: a key that only looked different
    (a write between them) is dropped by the check in the batch transaction."""
    make_pair(target_db, 1_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items_copy SET b = 'x' WHERE id = 70"))
    real = ChecksumPipeline.compute

    def with_phantoms(self, lo, hi, scanned):
        compared = real(self, lo, hi, scanned)
        compared.found = sorted([*compared.found, (80, "different"), (90, "missing_in_target")])
        return compared

    monkeypatch.setattr(ChecksumPipeline, "compute", with_phantoms)
    job = CHECKSUM.submit(target_db, 307, {"table": "items", "target": "items_copy",
                                           "compare_in": "spark"})
    assert found(run_split(target_db, job, [10, 10_001])) == [[70, "different"]]


# --- validation (DESIGN 11) --------------------------------------------------------


@pytest.mark.parametrize(("params", "says"), [
    ({"table": "nope", "target": "items_copy"}, "does not exist"),
    ({"table": "items", "target": ""}, "no --target"),
    ({"table": "items", "target": "nope"}, "target table 'nope' does not exist"),
    ({"table": "items", "target": "items"}, "same table"),
    ({"table": "items", "target": "nokey"}, "needs it as its primary key"),
    ({"table": "items", "target": "otherkey"}, "primary key (k)"),
    ({"table": "items", "target": "items_copy", "columns": ["a,nosuch"]}, "nosuch does not exist"),
    ({"table": "items", "target": "items_copy", "columns": ["a;drop"]}, "not a plain column"),
    ({"table": "items", "target": "narrow"}, "has no column b, c"),
    ({"table": "items", "target": "texty"}, "cannot be compared"),
    ({"table": "empty", "target": "items_copy"}, "is empty"),
    ({"table": "items", "target": "items_copy", "compare_in": "magic"}, "compare_in"),
])
def test_bad_input_is_rejected_with_one_line_and_changes_nothing(spark, target_db, params, says):
    make_pair(target_db, 100)
    with target_db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE nokey (id bigint, a int, b text, c text)"))
        conn.execute(sa.text("CREATE TABLE otherkey (k bigint PRIMARY KEY, id bigint)"))
        conn.execute(sa.text("CREATE TABLE narrow (id bigint PRIMARY KEY, a int)"))
        conn.execute(sa.text("CREATE TABLE texty (id bigint PRIMARY KEY, a jsonb, b text, c text)"))
        conn.execute(sa.text("CREATE TABLE empty (id bigint PRIMARY KEY, a int)"))
    CHECKSUM.assert_rejected(target_db, params, says)


# --- through real in-process nodes ------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_checksum_job_succeeds_with_findings_and_reports_them(spark, db, start_node, mode):
    from backfill.checksum.job import register

    register()
    make_items(db, 20_000, step=3)
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items_copy AS SELECT * FROM items"))
        conn.execute(sa.text("ALTER TABLE items_copy ADD PRIMARY KEY (id)"))
        conn.execute(sa.text("UPDATE items_copy SET a = a + 1 WHERE id IN (4, 30001)"))
        conn.execute(sa.text("DELETE FROM items_copy WHERE id = 59998"))  # the largest key
        conn.execute(sa.text("INSERT INTO items_copy (id) VALUES (0), (2), (70000)"))
    before = table_rows(db), table_rows(db, "items_copy")
    job_id = submit(db, SubmitRequest("checksum", {"table": "items", "target": "items_copy",
                                                   "compare_in": mode},
                                      rows_per_subtask=5_000, batch_rows=1_000)).job_id
    start_node("n1", slots=2)
    # Mismatches are a finding, not a failure.
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert (table_rows(db), table_rows(db, "items_copy")) == before
    with db.begin() as conn:
        job = jobs.get(db, conn, job_id)
        assert job is not None
        result = report(job, history.subtasks_of_job(db, conn, job_id))
    assert result["complete"] and result["subtasks"] == 4
    assert result["rows_compared"] == 20_000
    assert result["mismatches"] == 6
    assert result["by_kind"] == {"missing_in_target": 1, "missing_in_source": 3, "different": 2}
    assert [(k["key"], k["kind"]) for k in result["keys"]] == [
        (0, "missing_in_source"), (2, "missing_in_source"), (4, "different"),
        (30001, "different"), (59998, "missing_in_target"), (70000, "missing_in_source")]
    assert result["keys_not_listed"] == 0
    assert result["ranges"][0]["start_key"] is None and result["ranges"][-1]["end_key"] is None
    assert sum(r["mismatches"] for r in result["ranges"]) == 6
