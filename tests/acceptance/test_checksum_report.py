"""``reorg checksum-report`` on checksum jobs run by a real ``reorg worker``:
the findings (counts by kind, key ranges, keys) as people and scripts see
them, and the exit code a script gates on: 0 equal, 3 different, 4 no
verdict yet. Bad input is one ``error:`` line and changes nothing."""

from __future__ import annotations

import json

from cli_support import (
    assert_one_error_line,
    dump,
    ok,
    reorg,
    reorg_json,
    submit,
)
from support import Workers, execute, make_items

MATCH, DIFFER, INCOMPLETE, BAD_INPUT = 0, 3, 4, 2


def make_copies(url: str) -> None:
    """``items`` (keys 1..3,000), ``items_same`` equal to it, and ``items_copy``
    differing in three rows: 1,500 missing, 9,000 extra, 42 changed."""
    make_items(url, 3_000)
    for copy in ("items_same", "items_copy"):
        execute(url, f"CREATE TABLE {copy} AS SELECT * FROM items")
        execute(url, f"ALTER TABLE {copy} ADD PRIMARY KEY (id)")
    execute(url, "DELETE FROM items_copy WHERE id = 1500")
    execute(url, "INSERT INTO items_copy (id, a, b) VALUES (9000, 1, 'extra')")
    execute(url, "UPDATE items_copy SET b = 'changed' WHERE id = 42")


def submit_checksum(url: str, target: str) -> int:
    return int(ok(reorg(url, "submit", "checksum", "--table", "items", "--target", target,
                        "--rows-per-subtask", "1000")).strip())


def run_to_end(url: str, job_id: int, workers: Workers) -> None:
    if not workers.started:
        workers.start_cli("w1")
    waited = reorg(url, "wait", str(job_id), "--timeout", "120", timeout=150)
    assert waited.returncode == 0, waited.stderr + "".join(w.log() for w in workers)


def test_report_of_tables_that_differ(migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_copies(url)
    job_id = submit_checksum(url, "items_copy")
    run_to_end(url, job_id, workers)

    result = reorg(url, "checksum-report", str(job_id))
    assert result.returncode == DIFFER, result.stdout + result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert f"checksum job {job_id}: public.items against public.items_copy" in out
    assert "succeeded, comparison complete" in out
    assert "rows compared      3,000 in 3 subtasks" in out
    assert "mismatches         3" in out
    counts = {line.split()[0]: line.split()[1] for line in out.splitlines()
              if line.strip().startswith(("missing_in_", "different"))}
    assert counts == {"missing_in_target": "1", "missing_in_source": "1", "different": "1"}
    assert "mismatching key ranges: 3" in out
    assert "(-inf, 1001)" in out and "[2001, +inf)" in out
    key_lines = [line.split() for line in out.splitlines() if line.startswith("    ")
                 and line.split()[0].isdigit()]
    assert key_lines == [["42", "different"], ["1500", "missing_in_target"],
                         ["9000", "missing_in_source"]]
    assert out.rstrip().endswith("tables differ: 3 mismatching keys")

    # --json: report() itself, with the same exit code.
    as_json = reorg(url, "checksum-report", str(job_id), "--json")
    assert as_json.returncode == DIFFER and as_json.stderr == ""
    found = json.loads(as_json.stdout)
    assert (found["job_id"], found["table"], found["target"], found["state"]) == (
        job_id, "public.items", "public.items_copy", "succeeded")
    assert (found["complete"], found["subtasks"], found["rows_compared"]) == (True, 3, 3_000)
    assert found["columns"] == ["a", "b", "c"]
    assert found["mismatches"] == 3
    assert found["by_kind"] == {"missing_in_target": 1, "missing_in_source": 1, "different": 1}
    assert found["keys"] == [{"key": 42, "kind": "different"},
                             {"key": 1500, "kind": "missing_in_target"},
                             {"key": 9000, "kind": "missing_in_source"}]
    assert found["keys_not_listed"] == 0 and found["ranges_not_listed"] == 0
    assert [(r["start_key"], r["end_key"]) for r in found["ranges"]] == [
        (None, 1001), (1001, 2001), (2001, None)]
    assert sum(r["mismatches"] for r in found["ranges"]) == 3

    # --max-keys caps the keys listed, never the counts.
    capped = reorg(url, "checksum-report", str(job_id), "--json", "--max-keys", "1")
    assert capped.returncode == DIFFER
    capped_found = json.loads(capped.stdout)
    assert capped_found["keys"] == found["keys"][:1] and capped_found["keys_not_listed"] == 2
    assert capped_found["mismatches"] == 3
    short = reorg(url, "checksum-report", str(job_id), "--max-keys", "1")
    assert short.returncode == DIFFER
    assert "mismatching keys: first 1 of 3" in short.stdout and "... 2 more" in short.stdout

    # `reorg status JOB` of a checksum job says how many it found.
    status = ok(reorg(url, "status", str(job_id)))
    assert ("checksum: 3 mismatches (1 missing_in_target, 1 missing_in_source, 1 different); "
            f"`reorg checksum-report {job_id}` lists them") in status


def test_report_of_identical_tables_exits_0(migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_copies(url)
    job_id = submit_checksum(url, "items_same")
    run_to_end(url, job_id, workers)
    out = ok(reorg(url, "checksum-report", str(job_id)))
    assert "mismatches         0" in out and "mismatching key" not in out
    assert out.rstrip().endswith("tables match: 3,000 rows compared, no mismatches")
    found = reorg_json(url, "checksum-report", str(job_id))
    assert (found["complete"], found["mismatches"], found["keys"], found["ranges"]) == (
        True, 0, [], [])
    assert "checksum: 0 mismatches" in ok(reorg(url, "status", str(job_id)))


def test_report_before_the_job_ran_exits_4(migrated_db: str) -> None:
    url = migrated_db
    make_copies(url)
    job_id = submit_checksum(url, "items_copy")  # no worker: it stays queued
    result = reorg(url, "checksum-report", str(job_id))
    assert result.returncode == INCOMPLETE, result.stdout + result.stderr
    assert "queued, comparison not complete" in result.stdout
    assert f"no verdict yet: job {job_id} is queued; run `reorg wait {job_id}`" in result.stdout
    as_json = reorg(url, "checksum-report", str(job_id), "--json")
    assert as_json.returncode == INCOMPLETE
    found = json.loads(as_json.stdout)
    assert (found["state"], found["complete"], found["subtasks"]) == ("queued", False, 0)


def test_report_of_a_non_checksum_or_unknown_job_is_one_line(migrated_db: str) -> None:
    url = migrated_db
    make_items(url, 100)
    other = submit(url, "--table", "items", "--set", "c=b")
    before = dump(url)
    for args in ([str(other)], [str(other), "--json"]):
        line = assert_one_error_line(reorg(url, "checksum-report", *args), BAD_INPUT)
        assert f"job {other} is a sql-update job, not a checksum job" in line
    line = assert_one_error_line(reorg(url, "checksum-report", "999"), BAD_INPUT)
    assert "job 999 does not exist" in line
    assert_one_error_line(reorg(url, "checksum-report", "many"), BAD_INPUT)
    assert_one_error_line(reorg(url, "checksum-report", "1", "--max-keys", "-1"), BAD_INPUT)
    assert dump(url) == before
