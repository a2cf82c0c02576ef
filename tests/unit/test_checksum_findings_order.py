"""``reorg checksum-report``'s findings in the database's key order: the
subtasks' and their batches' order, never Python's order of the keys."""

from __future__ import annotations

from backfill.checksum.batches import META_KEY
from backfill.checksum.report import report
from framework.records import Job


def _job() -> Job:
    return Job(id=7, type="checksum", state="succeeded", step=1,
               params={"target": "u", "columns": []}, target_table='"public"."t"',
               key_column='"k"', batch_rows=100, max_rows_per_sec=None, row_estimate=20)


def _subtask(ordinal: int, lo, hi, keys: list[list]) -> dict:
    found = {"different": len(keys), "ranges": [[lo, hi, len(keys)]],
             "keys": [[k, "different"] for k in keys]}
    return {"step": 1, "ordinal": ordinal, "state": "succeeded", "row_count": 10,
            "meta": {META_KEY: found}}


def test_keys_and_ranges_keep_the_subtasks_key_order_not_pythons():
    # A text key under a linguistic collation: 'a' < 'B' < 'c' in the
    # database, where Python sorts ["B"] before ["a"]. The subtasks arrive
    # out of ordinal order (as a caller might read them).
    subtasks = [_subtask(1, ["B"], None, [["B"], ["c"]]),
                _subtask(0, None, ["B"], [["a"]])]
    found = report(_job(), subtasks)
    assert [k["key"] for k in found["keys"]] == [["a"], ["B"], ["c"]]
    assert [(r["start_key"], r["end_key"]) for r in found["ranges"]] == [
        (None, ["B"]), (["B"], None)]
    assert found["mismatches"] == 3 and found["complete"]
