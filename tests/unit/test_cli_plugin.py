"""What a job type brings to the CLI (cli.plugin): its submit options, found
on the registered type or by a "module:function" name, and the generic
``--param KEY=VALUE`` options of a type that declares none."""

from __future__ import annotations

import pytest

from cli import plugin
from framework.errors import InvalidParams


def test_generic_options_read_json_values_and_keep_other_text():
    params = plugin.generic_options("items", ["n=3", "flag=true", "cols=[\"a\", \"b\"]",
                                              "expr=md5(b)", "eq=a=b"])
    assert params == {"table": "items", "n": 3, "flag": True, "cols": ["a", "b"],
                      "expr": "md5(b)", "eq": "a=b"}


@pytest.mark.parametrize("pair", ["novalue", "=3", " =x"])
def test_a_param_that_is_not_key_value_is_one_clear_error(pair):
    with pytest.raises(InvalidParams, match="is not KEY=VALUE; write e.g. --param column=d"):
        plugin.generic_options("items", [pair])


def test_submit_options_by_function_by_name_or_generic():
    class ByName:
        submit_options = "backfill.checksum.options:checksum"

    class ByFunction:
        @staticmethod
        def submit_options(table: str) -> dict:
            return {"table": table}

    from backfill.checksum.options import checksum

    assert plugin.submit_options(ByName()) is checksum
    assert plugin.submit_options(ByFunction()) is ByFunction.submit_options
    assert plugin.submit_options(object()) is plugin.generic_options
