"""The verify's row hash (``backfill.rewrite.verify.column_hash``): a type
whose equality is its identity is hashed by value, whatever its typmod;
every other type by its text; a NULL is a constant of the column's place."""

from __future__ import annotations

import pytest

from backfill.rewrite.verify import column_hash, row_hash


@pytest.mark.parametrize(("type_", "hashed"), [
    ("integer", "hashint4extended(x.c, 2)"),
    ("bigint", "hashint8extended(x.c, 2)"),
    ("character(84)", 'hashbpcharextended(x.c COLLATE "C", 2)'),
    ("character varying(20)", 'hashtextextended(CAST(x.c AS text) COLLATE "C", 2)'),
    ("timestamp(3) without time zone", "timestamp_hash_extended(x.c, 2)"),
    # equal but not the same: by their text
    ("numeric(10,2)", "hashtextextended(CAST(x.c AS text), 2)"),
    ("timestamp with time zone", "hashtextextended(CAST(x.c AS text), 2)"),
    ("interval", "hashtextextended(CAST(x.c AS text), 2)"),
    ("integer[]", "hashtextextended(CAST(x.c AS text), 2)"),
    ("jsonb", "hashtextextended(CAST(x.c AS text), 2)"),
])
def test_a_column_is_hashed_by_value_only_where_equal_values_are_the_same(type_, hashed):
    assert column_hash("x.c", type_, 2) == f"coalesce({hashed}, -2)"


def test_a_row_is_its_columns_hashes_seeded_by_place_and_xored():
    assert row_hash([("x.a", "integer"), ("x.b", "text")]) == (
        'coalesce(hashint4extended(x.a, 1), -1) # '
        'coalesce(hashtextextended(x.b COLLATE "C", 2), -2)')
    assert row_hash([]) == "CAST(0 AS bigint)"
