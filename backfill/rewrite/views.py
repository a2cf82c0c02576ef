"""Views on T pointed at the new table by the swap (``carry``).

A view's query names T by its oid: renamed away, T would still be what
the view reads. ``CREATE OR REPLACE VIEW`` of the view's own definition
(read with qualified names while T had its name, ``qualified``) makes it
read the new table, and keeps everything else of the view: its oid, owner,
grants, comments, the views and rules that use it. It takes the view's
options (``security_barrier``, ``check_option``, ...) again, since it would
reset them.

When a column's type changed (an --alter), PostgreSQL does not replace a
view whose column changes type: the view, and every view on it, is dropped
and created again with its owner, grants, comments and options. Anything
else that depends on such a view (a materialized view, a function, a rule
or trigger on it) cannot be carried: the swap refuses, naming it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite import grants
from backfill.rewrite.qualified import qualified_names
from backfill.schema.sql import literal, run
from framework.errors import one_line


class CannotCarry(RuntimeError):
    """Something of T the swap cannot carry to the new table: the swap rolls back."""


@dataclass(frozen=True)
class View:
    name: str  # qualified, quoted
    definition: str
    options: tuple[str, ...]


def point_at_new_table(conn: Connection, view: View) -> None:
    try:
        with conn.begin_nested():
            run(conn, _create(view, replace=True))
        return
    except Exception as exc:
        reason = one_line(exc)
    _recreate(conn, view, reason)


def _create(view: View, *, replace: bool) -> str:
    options = f" WITH ({', '.join(view.options)})" if view.options else ""
    verb = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW"
    return f"{verb} {view.name}{options} AS {view.definition}"


def _recreate(conn: Connection, view: View, reason: str) -> None:
    """The view and the views on it dropped and made again, with their
    properties; CannotCarry when something else depends on one of them."""
    with qualified_names(conn):
        closure = conn.execute(text(_CLOSURE), {"v": view.name}).all()
        others = conn.execute(text(_OTHER_DEPENDENTS), {"v": [c[0] for c in closure]}).scalars()
        blocking = list(others)
        if blocking:
            raise CannotCarry(
                f"view {view.name} must be made again on the new table ({reason}), but "
                f"{blocking[0]} depends on it; drop that before the rewrite and create it "
                "again after")
        me = conn.execute(text("SELECT quote_ident(current_user)")).scalar_one()
        saved = []
        for oid, name, definition, options, owner, comment, default_acl in closure:
            acl = None if default_acl else [
                (grantor, f"GRANT {privilege} ON {name} TO {grantee}", grantable)
                for grantor, grantee, privilege, grantable in conn.execute(
                    text(grants.ACL), {"t": name})]
            columns = conn.execute(text("SELECT quote_ident(attname), col_description(attrelid, "
                                        "attnum) FROM pg_attribute WHERE attrelid = :o AND "
                                        "attnum > 0 AND col_description(attrelid, attnum) IS "
                                        "NOT NULL"), {"o": oid}).all()
            current = View(name, view.definition if name == view.name else definition,
                           tuple(options or ()))
            saved.append((current, owner, comment, acl, columns))
    run(conn, f"DROP VIEW {', '.join(v.name for v, *_ in saved)}")
    for current, owner, comment, acl, columns in saved:
        try:
            run(conn, _create(current, replace=False))
        except Exception as exc:
            raise CannotCarry(f"view {current.name} cannot be made again on the new table "
                              f"({one_line(exc)}); drop it before the rewrite and create it "
                              "again after") from None
        run(conn, f"ALTER VIEW {current.name} OWNER TO {owner}")
        if acl is not None:
            for statement in grants.statements(
                    owner, me, grants.revoke_all(current.name, owner, set()), acl):
                run(conn, statement)
        if comment is not None:
            run(conn, f"COMMENT ON VIEW {current.name} IS {literal(comment)}")
        for column, text_ in columns:
            run(conn, f"COMMENT ON COLUMN {current.name}.{column} IS {literal(text_)}")


# The view and every view that reads it, directly or through another,
# in the order they can be created (a view after those it reads: by oid).
_CLOSURE = """
    WITH RECURSIVE closure(oid) AS (
        SELECT to_regclass(:v)::oid
        UNION
        SELECT r.ev_class FROM closure c
        JOIN pg_depend d ON d.refclassid = 'pg_class'::regclass AND d.refobjid = c.oid
             AND d.classid = 'pg_rewrite'::regclass
        JOIN pg_rewrite r ON r.oid = d.objid
        JOIN pg_class v ON v.oid = r.ev_class AND v.relkind = 'v' AND v.oid <> c.oid)
    SELECT v.oid, format('%I.%I', n.nspname, v.relname), pg_get_viewdef(v.oid), v.reloptions,
           quote_ident(pg_get_userbyid(v.relowner)), obj_description(v.oid, 'pg_class'),
           v.relacl IS NULL
    FROM closure c JOIN pg_class v ON v.oid = c.oid
    JOIN pg_namespace n ON n.oid = v.relnamespace
    ORDER BY v.oid"""

# What else depends on those views (their own _RETURN rules aside).
_OTHER_DEPENDENTS = """
    SELECT DISTINCT replace(pg_describe_object(d.classid, d.objid, 0), 'rule _RETURN on ', '')
    FROM pg_depend d
    WHERE d.refclassid = 'pg_class'::regclass
      AND d.refobjid = ANY(CAST(:v AS oid[])) AND d.deptype = 'n'
      AND NOT (d.classid = 'pg_rewrite'::regclass AND EXISTS (
          SELECT 1 FROM pg_rewrite r JOIN pg_class v ON v.oid = r.ev_class
          WHERE r.oid = d.objid AND r.rulename = '_RETURN' AND v.relkind = 'v'
            AND v.oid = ANY(CAST(:v AS oid[]))))
    ORDER BY 1"""
