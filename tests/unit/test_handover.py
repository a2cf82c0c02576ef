"""``--method rewrite`` of alter-type and add-column as a rewrite's params."""

import pytest

from backfill.rewrite import handover
from framework.errors import InvalidParams


def test_column_is_the_default_and_hands_nothing_over() -> None:
    assert handover.alter_type({"table": "t", "column": "a", "type": "bigint"}) is None
    assert handover.add_column({"table": "t", "column": "d:text", "value": "b",
                                "method": "column"}) is None


def test_alter_type_becomes_one_alter_column_action() -> None:
    assert handover.alter_type({"table": "s.t", "column": "Mixed", "type": "numeric(10,2)",
                                "using": "a / 100.0", "method": "rewrite"}) == (
        "rewrite", {"table": "s.t",
                    "alter": 'ALTER COLUMN "Mixed" TYPE numeric(10,2) USING a / 100.0'})


def test_add_column_becomes_an_add_column_action_and_its_set() -> None:
    assert handover.add_column({"table": "t", "column": "d:text", "value": "md5(b)",
                                "default": "'x'", "not_null": True, "method": "rewrite"}) == (
        "rewrite", {"table": "t", "alter": 'ADD COLUMN "d" text DEFAULT \'x\' NOT NULL',
                    "sets": [["d", "md5(b)"]]})


@pytest.mark.parametrize("params", [
    {"column": "d", "value": "b", "method": "rewrite"},
    {"column": "d:text", "value": " ", "method": "rewrite"},
    {"column": "d:text", "value": "b", "method": "copy"},
])
def test_bad_input_is_one_line(params: dict) -> None:
    with pytest.raises(InvalidParams) as refused:
        handover.add_column({"table": "t", **params})
    assert "\n" not in str(refused.value)
