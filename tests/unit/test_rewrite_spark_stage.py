"""``rewrite --engine spark``'s temporary stage: one per column type, key
shape and submitter. The stage is made, and written, as the submitter
(the copy runs as them), so it is theirs alone: a job of another role that
met it on the same pooled session could not write it."""

from backfill.rewrite.spark_rows import stage_name


def test_each_role_has_a_stage_of_its_own():
    a = stage_name("text", ("bigint",), "alice")
    assert a == stage_name("text", ("bigint",), "alice")
    assert a != stage_name("text", ("bigint",), "bob")
    assert a != stage_name("text", ("bigint",), None)


def test_the_stage_follows_the_column_type_and_the_key():
    a = stage_name("text", ("bigint",), "alice")
    assert a != stage_name("integer", ("bigint",), "alice")
    assert a != stage_name("text", ("text", "integer"), "alice")
    assert len(a) <= 63 and a.startswith("reorg_rewrite_stage_")

