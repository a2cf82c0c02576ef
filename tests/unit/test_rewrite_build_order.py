"""The order of a rewrite's builds, without a server (issue 24): a foreign
key of the new table to itself, from T, an --alter or the --like file, is
made on the shadow to the shadow, and waits for the shadow's unique
indexes; nothing else waits for anything; a plan stored before these
fields still loads."""

from __future__ import annotations

from backfill.rewrite import alter, builds, like
from backfill.rewrite.builds import Build, Shadow

SHADOW = Shadow(7, "public", "reorg_7_items", partitioned=False)
KEY = Build("items_pkey", "reorg_7_items_pkey", "index", ("CREATE UNIQUE INDEX ...",),
            unique=True)
PLAIN = Build("items_c_idx", "reorg_7_items_c_idx", "index", ("CREATE INDEX ...",))
CHECK = Build("items_a_check", "items_a_check", "constraint", ("ALTER TABLE ...",))


def _foreign_key(name: str, definition: str, *, itself: bool) -> Build:
    return builds.of_constraint(SHADOW, alter.AddedConstraint(name, "f", definition, itself))


def test_a_foreign_key_to_itself_needs_the_shadows_unique_indexes_and_goes_after_them():
    fk = _foreign_key("items_up_fkey", "FOREIGN KEY (up) REFERENCES items (id)", itself=True)
    assert "REFERENCES public.reorg_7_items (id)" in fk.statements[0]
    assert builds.needed_by(fk, (fk, PLAIN, KEY, CHECK)) == [KEY]
    assert builds.in_order([fk, PLAIN, KEY, CHECK]) == [PLAIN, KEY, CHECK, fk]


def test_a_foreign_key_to_another_table_and_the_others_need_nothing():
    fk = _foreign_key("items_b_fkey", "FOREIGN KEY (b) REFERENCES parent (code)", itself=False)
    assert "REFERENCES parent (code)" in fk.statements[0]
    for made in (fk, KEY, PLAIN, CHECK):
        assert builds.needed_by(made, (fk, KEY, PLAIN, CHECK)) == []
    assert builds.in_order([fk, KEY, PLAIN, CHECK]) == [fk, KEY, PLAIN, CHECK]


def test_alter_and_like_tell_a_foreign_key_to_the_table_itself():
    added = alter.parse("ADD CONSTRAINT up_fk FOREIGN KEY (up) REFERENCES items, "
                        "ADD CONSTRAINT b_fk FOREIGN KEY (b) REFERENCES parent (code), "
                        "ADD CONSTRAINT q_fk FOREIGN KEY (q) REFERENCES other.items (id)",
                        "public", "reorg_7_items", "items").added
    assert [(c.name, c.self_reference) for c in added] == [
        ("up_fk", True), ("b_fk", False), ("q_fk", False)]
    shape = like.parse("CREATE TABLE new_items (id int PRIMARY KEY, "
                       "up int REFERENCES new_items, b text REFERENCES parent, "
                       "CONSTRAINT too FOREIGN KEY (b) REFERENCES public.new_items (id))",
                       "public", "reorg_7_items", "items")
    assert [(c.contype, c.self_reference) for c in shape.constraints] == [
        ("p", False), ("f", True), ("f", False), ("f", True)]


def test_a_plan_stored_before_the_order_loads():
    stored = {"final": "items_pkey", "temp": "reorg_7_items_pkey", "kind": "index",
              "statements": ["CREATE UNIQUE INDEX ..."], "validate": None}
    loaded = Build.from_param(stored)
    assert (loaded.unique, loaded.self_reference) == (False, False)
    assert Build.from_param(KEY.to_param()) == KEY
