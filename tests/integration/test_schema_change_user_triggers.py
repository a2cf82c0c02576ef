"""Schema changes on a table with triggers of its own (DESIGN 14; issue 22
items 2 and 5).

- What reaches the new column is the row as every user BEFORE trigger leaves
  it: reorg's triggers fire after the user's (PostgreSQL fires BEFORE
  triggers in name order), a table whose BEFORE trigger would sort after
  reorg's is refused at submit, and one made so during the job fails the job
  at its cut-over, which rolls it back.
- A job's backfill is an UPDATE of every row: it would fire the table's own
  row triggers on each (an ``updated_at`` stamp, an audit log). A table with
  such triggers is refused at submit, naming them and the ways out, unless
  the user accepts it (``--allow-user-triggers``)."""

from __future__ import annotations

import pytest
from support import catalogue, execute, rows, scalar, wait_state
from support.app_model import shape

from framework import control, faults
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 2_000

LOWER_EMAIL = """
    CREATE FUNCTION lower_email() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN NEW.email := lower(NEW.email); RETURN NEW; END $$;
    CREATE TRIGGER trg_lower_email BEFORE INSERT OR UPDATE ON items
        FOR EACH ROW EXECUTE FUNCTION lower_email()"""

STAMP_AND_AUDIT = """
    ALTER TABLE items ADD COLUMN updated_at timestamptz;
    CREATE TABLE audit (id bigint, at timestamptz DEFAULT clock_timestamp());
    CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN NEW.updated_at := clock_timestamp(); RETURN NEW; END $$;
    CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO audit (id) VALUES (NEW.id); RETURN NULL; END $$;
    CREATE TRIGGER items_updated_at BEFORE UPDATE ON items
        FOR EACH ROW EXECUTE FUNCTION stamp();
    CREATE TRIGGER items_audit AFTER UPDATE ON items
        FOR EACH ROW EXECUTE FUNCTION audit()"""


def _items(url: str, *ddl: str) -> None:
    execute(url, f"""
        CREATE TABLE items (id serial PRIMARY KEY, email varchar(40), b text);
        INSERT INTO items (email, b) SELECT 'user' || g || '@example.com', 'v' || g
        FROM generate_series(1, {ROWS}) g;
        ANALYZE items""")
    for statement in ddl:
        execute(url, statement)


def _alter_email(dry_run: bool = False, **params) -> SubmitRequest:
    return SubmitRequest("alter-type", {"table": "items", "column": "email", "type": "text",
                                        **params}, rows_per_subtask=500, batch_rows=200,
                         dry_run=dry_run)


def _add_column(dry_run: bool = False, **params) -> SubmitRequest:
    return SubmitRequest("add-column", {"table": "items", "column": "d:text", "value": "b",
                                        **params}, rows_per_subtask=500, batch_rows=200,
                         dry_run=dry_run)


def _unchanged(db, url):
    """What a refused submit must leave as it was: the catalogue, the rows, no job."""
    return (catalogue(db.engine), shape(db.engine),
            rows(db, "SELECT * FROM items ORDER BY id"), scalar(db, "SELECT count(*) FROM {s}.jobs"))


# -- item 2: the order of BEFORE triggers ----------------------------------------------


def test_alter_type_keeps_the_value_the_users_before_trigger_leaves(db, settings, start_node):
    """The issue's repro: email varchar(40) -> text with a trigger that
    lower-cases it; a write after the verify step reaches the new column as
    that trigger leaves it."""
    url = settings.database_url
    _items(url, LOWER_EMAIL)
    faults.arm("alter_type.before_build", "block")  # after verify
    job_id = submit(db, _alter_email(allow_user_triggers=True)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("alter_type.before_build", 60)
    execute(url, "UPDATE items SET email = 'Alice@Example.COM' WHERE id = 5; "
                 "INSERT INTO items (id, email) VALUES (5000, 'Bob@Example.COM')")
    faults.release("alter_type.before_build")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert rows(db, "SELECT id, email FROM items WHERE id IN (5, 5000) ORDER BY id") == [
        (5, "alice@example.com"), (5000, "bob@example.com")]
    assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                      "WHERE attrelid = 'items'::regclass AND attname = 'email'") == "text"


def test_add_column_computes_the_value_from_the_row_as_the_users_trigger_leaves_it(
        db, settings, start_node):
    url = settings.database_url
    # OF b: the backfill (an UPDATE of d only) never fires it; every write of b does.
    _items(url, """
        CREATE FUNCTION lower_b() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN NEW.b := lower(NEW.b); RETURN NEW; END $$;
        CREATE TRIGGER trg_lower_b BEFORE INSERT OR UPDATE OF b ON items
            FOR EACH ROW EXECUTE FUNCTION lower_b()""")
    faults.arm("owner.before_cutover", "block")  # the backfill done, the trigger on
    job_id = submit(db, _add_column()).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("owner.before_cutover", 60)
    execute(url, "UPDATE items SET b = 'ABC' WHERE id = 5; "
                 "INSERT INTO items (id, b) VALUES (5000, 'DEF')")
    faults.release("owner.before_cutover")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert rows(db, "SELECT id, b, d FROM items WHERE id IN (5, 5000) ORDER BY id") == [
        (5, "abc", "abc"), (5000, "def", "def")]
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM b") == 0


@pytest.mark.parametrize("name", ["~zz_late", "é_late"])
@pytest.mark.parametrize("request_of", [_alter_email, _add_column], ids=["alter-type",
                                                                         "add-column"])
def test_a_before_trigger_that_would_fire_after_reorgs_is_refused_at_submit(
        db, settings, request_of, name):
    url = settings.database_url
    _items(url, f"""
        CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RETURN NEW; END $$;
        CREATE TRIGGER "{name}" BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION noop()""")
    before = _unchanged(db, url)
    with pytest.raises(InvalidParams) as raised:
        submit(db, request_of())
    message = str(raised.value)
    assert f"trigger {name} on public.items" in message and "\n" not in message, message
    assert "fires after" in message and "rename it" in message, message
    assert _unchanged(db, url) == before


@pytest.mark.parametrize("request_of", [_alter_email, _add_column], ids=["alter-type",
                                                                         "add-column"])
def test_a_before_trigger_made_to_fire_after_reorgs_during_the_job_fails_it_at_the_cut_over(
        db, settings, start_node, request_of):
    url = settings.database_url
    _items(url)
    before = shape(db.engine)
    faults.arm("owner.before_cutover", "block")
    job_id = submit(db, request_of()).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("owner.before_cutover", 60)
    execute(url, """
        CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RETURN NEW; END $$;
        CREATE TRIGGER "~zz_late" BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION noop()""")
    faults.release("owner.before_cutover")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "reverted", done
    assert "trigger ~zz_late on public.items" in done["error"] and "\n" not in done["error"]
    after = shape(db.engine)  # as before the job, but for the user's new trigger
    assert after["triggers"] == [("~zz_late",)]
    assert {**after, "triggers": []} == before


# -- item 5: the table's own row triggers ----------------------------------------------


@pytest.mark.parametrize("request_of", [_alter_email, _add_column], ids=["alter-type",
                                                                         "add-column"])
def test_a_table_whose_row_triggers_an_update_fires_is_refused_naming_them(
        db, settings, request_of):
    url = settings.database_url
    _items(url, STAMP_AND_AUDIT)
    before = _unchanged(db, url)
    with pytest.raises(InvalidParams) as raised:
        submit(db, request_of())
    message = str(raised.value)
    assert "\n" not in message, message
    assert "items_audit, items_updated_at" in message, message
    assert "--allow-user-triggers" in message and "DISABLE TRIGGER" in message, message
    assert _unchanged(db, url) == before


@pytest.mark.parametrize("request_of", [_alter_email, _add_column], ids=["alter-type",
                                                                         "add-column"])
def test_a_statement_trigger_an_update_fires_is_refused_too(db, settings, request_of):
    """Each backfill batch is an UPDATE statement: a FOR EACH STATEMENT
    trigger would fire once a batch, which a plain ALTER TABLE never does."""
    url = settings.database_url
    _items(url, """
        CREATE FUNCTION touched() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_notify('items_changed', ''); RETURN NULL; END $$;
        CREATE TRIGGER items_changed AFTER UPDATE ON items
            FOR EACH STATEMENT EXECUTE FUNCTION touched()""")
    before = _unchanged(db, url)
    with pytest.raises(InvalidParams) as raised:
        submit(db, request_of())
    message = str(raised.value)
    assert "\n" not in message, message
    assert "statement trigger an UPDATE fires: items_changed" in message, message
    assert "on each batch" in message and "--allow-user-triggers" in message, message
    assert _unchanged(db, url) == before
    with_rows = STAMP_AND_AUDIT.replace("items_audit AFTER", "items_notify AFTER")
    execute(url, "DROP TABLE items")
    _items(url, with_rows.replace("CREATE FUNCTION audit", "CREATE OR REPLACE FUNCTION audit")
           .replace("CREATE TABLE audit", "CREATE TABLE IF NOT EXISTS audit")
           .replace("CREATE FUNCTION stamp", "CREATE OR REPLACE FUNCTION stamp"), """
        CREATE TRIGGER items_changed AFTER UPDATE ON items
            FOR EACH STATEMENT EXECUTE FUNCTION touched()""")
    with pytest.raises(InvalidParams, match="has triggers an UPDATE fires: items_notify, "
                       r"items_updated_at, items_changed \(for each statement\); .* on each "
                       "row or batch"):
        submit(db, request_of())


@pytest.mark.parametrize("request_of", [_alter_email, _add_column], ids=["alter-type",
                                                                         "add-column"])
def test_with_allow_user_triggers_the_job_runs_and_its_values_are_right(
        db, settings, start_node, request_of):
    url = settings.database_url
    _items(url, STAMP_AND_AUDIT)
    job_id = submit(db, request_of(allow_user_triggers=True)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    if request_of is _add_column:
        assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM b") == 0
    else:
        assert scalar(db, "SELECT count(*) FROM items WHERE email <> "
                          "'user' || id || '@example.com'") == 0
    # Accepted: the backfill fired them, on every row.
    assert scalar(db, "SELECT count(*) FROM items WHERE updated_at IS NULL") == 0
    assert scalar(db, "SELECT count(DISTINCT id) FROM audit") == ROWS


@pytest.mark.parametrize("request_of", [_alter_email, _add_column], ids=["alter-type",
                                                                         "add-column"])
def test_disabled_triggers_and_triggers_of_other_columns_are_not_refused(
        db, settings, request_of):
    url = settings.database_url
    _items(url, STAMP_AND_AUDIT, "ALTER TABLE items DISABLE TRIGGER items_updated_at",
           "DROP TRIGGER items_audit ON items",
           "CREATE TRIGGER items_audit AFTER UPDATE OF b ON items "
           "FOR EACH ROW EXECUTE FUNCTION audit()")
    assert submit(db, request_of(dry_run=True)).job_id is None  # accepted, nothing made


# -- jobs prepared by the version before these names ----------------------------------


def _as_prepared_before(url: str, job_type: str, job_id: int) -> None:
    """Make the job's objects what the version before prepared: one trigger
    under the old name, no ownership table (add-column)."""
    if job_type == "alter-type":
        execute(url, f'ALTER TRIGGER "~reorg_{job_id}_alter_type" ON items '
                     f'RENAME TO "reorg_{job_id}_alter_type"')
        return
    ours = [name for (name,) in execute(
        url, f"SELECT tgname FROM pg_trigger WHERE tgname LIKE '~reorg_{job_id}_%'")]
    execute(url, "; ".join(f'DROP TRIGGER "{name}" ON items' for name in ours))
    execute(url, f"""
        DROP FUNCTION reorg.add_column_{job_id}_book; DROP FUNCTION reorg.add_column_{job_id}_owns;
        DROP TABLE reorg.add_column_{job_id}_owned;
        CREATE TRIGGER reorg_add_column_{job_id} BEFORE INSERT OR UPDATE ON items
            FOR EACH ROW EXECUTE FUNCTION reorg.add_column_{job_id}()""")


@pytest.mark.parametrize(("request_of", "outcome"), [(_add_column, "succeeded"),
                                                     (_alter_email, "cancelled")],
                         ids=["add-column-cut-over", "alter-type-rollback"])
def test_a_job_prepared_under_the_old_trigger_name_ends_without_leaving_it(
        db, settings, start_node, request_of, outcome):
    """A job in flight across an upgrade: its batches run (add-column's
    without its ownership table), and its cut-over or rollback drops the
    trigger it made under the old name (both use the same list of names)."""
    url = settings.database_url
    _items(url)
    before = shape(db.engine)
    faults.arm("worker.after_claim", "block")
    request = request_of()
    job_type = request.type
    job_id = submit(db, SubmitRequest(job_type, request.params, rows_per_subtask=ROWS,
                                      batch_rows=200)).job_id
    start_node("n1", slots=1)
    faults.wait_blocked("worker.after_claim", 60)  # prepared, no batch yet
    _as_prepared_before(url, job_type, job_id)
    if outcome == "cancelled":
        control.cancel(db, job_id)
    faults.release("worker.after_claim")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == outcome, done["error"]
    after = shape(db.engine)
    assert after["triggers"] == [] and after["functions"] == [] and after["work_tables"] == []
    assert scalar(db, "SELECT count(*) FROM pg_proc WHERE proname LIKE 'alter_type_%'") == 0
    if outcome == "cancelled":
        assert after == before
    elif job_type == "add-column":
        assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM b") == 0
    else:
        assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                          "WHERE attrelid = 'items'::regclass AND attname = 'email'") == "text"
