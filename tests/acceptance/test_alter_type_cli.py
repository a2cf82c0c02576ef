"""``reorg submit alter-type`` refusals through the command (DESIGN 11): each
bad input is one ``error:`` line, exit code 2, and every table as it was;
the dry run prints the DDL of each state and changes nothing."""

from __future__ import annotations

from cli_support import assert_one_error_line, dump, reorg
from support import execute

BAD_INPUT = 2
ITEMS_ROWS = 200

SCHEMA = """
    CREATE TABLE orders (id bigint PRIMARY KEY, item_id bigint REFERENCES items (id));
    CREATE TABLE nokey (a int, b text);
    CREATE TABLE regional (region text, n int, a int, PRIMARY KEY (region, n));
    INSERT INTO regional SELECT (ARRAY['eu', 'us'])[g % 2 + 1], g, g FROM generate_series(1, 9) g;
    GRANT SELECT (a) ON items TO PUBLIC;
    ALTER TABLE items ALTER COLUMN a SET STATISTICS 300;
"""

# Every refusal is checked through ``submit`` in tests/integration/test_alter_type_input.py
# (a process per case is seconds on a loaded machine); these two go through the command.
BAD = {
    "referencing foreign key": (["--table", "items", "--column", "id", "--type", "numeric"],
                                "referenced by foreign key orders_item_id_fkey"),
    "no usable key": (["--table", "nokey", "--column", "a", "--type", "bigint"],
                      "no primary key"),
    "a key column to a type without a btree order": (
        ["--table", "regional", "--column", "n", "--type", "json", "--using", "to_json(n)"],
        "column n of public.regional is in the key of public.regional (region text, n integer) "
        "and its unique index cannot be rebuilt on type json"),
}


def test_bad_alter_type_is_one_line_exit_2_and_the_dry_run_prints_each_state_changing_nothing(
        items_db: str):
    execute(items_db, SCHEMA)
    before = dump(items_db)
    for case, (args, says) in BAD.items():
        line = assert_one_error_line(reorg(items_db, "submit", "alter-type", *args), BAD_INPUT)
        assert says in line, case
        assert dump(items_db) == before, case
    result = reorg(items_db, "submit", "alter-type", "--table", "items", "--column", "a",
                   "--type", "bigint", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    for state in ("write-only", "write-reorg", "public"):
        assert state in out
    assert 'ADD COLUMN "a_reorg_new" bigint' in out
    assert "moves to the end of SELECT *" in out
    # What the cut-over sets again on the new column.
    assert 'GRANT SELECT ("a") ON "public"."items" TO PUBLIC' in out
    assert "SET STATISTICS 300" in out
    assert dump(items_db) == before
    # A composite key, its own column altered: ranges by (region, n), as people read them.
    result = reorg(items_db, "submit", "alter-type", "--table", "regional", "--column", "n",
                   "--type", "bigint", "--rows-per-subtask", "4", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "[('eu', 2), ('us', 1))  [('us', 1), ('us', 9))  [('us', 9), end)" in (
        result.stdout), result.stdout
    assert 'ADD COLUMN "n_reorg_new" bigint' in out
    assert dump(items_db) == before
