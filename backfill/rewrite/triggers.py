"""The triggers a rewrite puts on a user's table to follow its writes: the
change log's capture on T (``capture``) and, after a swap with
``--keep-old``, the reverse capture on the new T (``reverse``).

Both are AFTER triggers, so a write is followed as the user's own triggers
left it (and not at all when one of them cancelled it), enabled ALWAYS, so
they also fire for what a logical replication apply
(``session_replication_role = replica``) writes. A TRUNCATE fires no row
trigger, so each has an AFTER TRUNCATE twin that truncates the table it
writes into. Their functions run as their owner (SECURITY DEFINER, a fixed
search_path): the application's roles need no privilege on reorg's schema."""

from __future__ import annotations


def _function(name: str, body: str) -> str:
    """A trigger function running ``body`` (the lines between BEGIN and END)
    as its owner."""
    return f"""CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $reorg$
BEGIN
{body}
END $reorg$"""


def on_rows(table: str, trigger: str, function: str, body: str) -> list[str]:
    """``function`` running ``body`` after every row INSERT, UPDATE or DELETE
    of ``table``, through ``trigger`` (names qualified and quoted)."""
    return [
        _function(function, body),
        f"CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION {function}()",
        f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {trigger}",
    ]


def on_truncate(table: str, trigger: str, function: str, also: str) -> list[str]:
    """A TRUNCATE of ``table`` truncates ``also`` too, through ``function``
    and ``trigger``."""
    return [
        _function(function, f"  TRUNCATE {also};\n  RETURN NULL;"),
        f"CREATE TRIGGER {trigger} AFTER TRUNCATE ON {table} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
        f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {trigger}",
    ]


def remove(table: str, triggers: tuple[str, ...], functions: tuple[str, ...]) -> list[str]:
    """The triggers off ``table``, then their functions; each only if there."""
    return ([f"DROP TRIGGER IF EXISTS {t} ON {table}" for t in triggers]
            + [f"DROP FUNCTION IF EXISTS {f}()" for f in functions])
