"""A least-privilege installation for the security tests (this module holds
no tests): the roles of docs/security.md created in the session's server
under names of their own, the system tables installed by the admin role, the
grants applied as ``reorg db grants`` prints them, and everything dropped
afterwards (roles are server-wide)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from cli_support import ok, reorg
from psycopg import sql
from sqlalchemy.engine import make_url
from support import Workers, create_database, drop_database, execute, make_items

# Every URL of these tests carries it; no output may ever show it.
PASSWORD = "pw-Zq8xK3vR7-never-shown"


@dataclass
class Installation:
    admin_url: str  # the server's superuser, on the test database (a DBA)
    roles: dict[str, str]  # kind -> role name: admin, worker, alice, bob, carol, app
    workers: Workers  # `reorg worker` processes connecting as the worker role

    def url(self, kind: str) -> str:
        """The test database's URL as role ``kind``, with PASSWORD in it."""
        return (make_url(self.admin_url).set(username=self.roles[kind], password=PASSWORD)
                .render_as_string(hide_password=False))

    def as_role(self, kind: str, statement: str) -> list[tuple]:
        return execute(self.url(kind), statement)


@pytest.fixture
def installation(pg_server: str) -> Iterator[Installation]:
    """Roles: ``admin`` owns reorg's system tables (it ran ``reorg db upgrade``);
    ``worker`` (LOGIN NOINHERIT) is what ``reorg worker`` connects as;
    ``alice`` and ``bob`` are users the worker may act as, ``bob`` may also
    read ``secret_table``; ``carol`` is a user the worker may not act as;
    ``app`` owns the application's tables ``items`` (1,000 rows) and
    ``secret_table``, and the function ``peek()`` that reads it."""
    suffix = uuid.uuid4().hex[:8]
    roles = {kind: f"sec_{kind}_{suffix}" for kind in
             ("admin", "worker", "alice", "bob", "carol", "app")}
    name = f"t_security_{suffix}"
    url = create_database(pg_server, name)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        for kind, role in roles.items():
            inherit = "NOINHERIT" if kind == "worker" else ""
            conn.execute(sql.SQL(f"CREATE ROLE {{}} LOGIN {inherit}").format(sql.Identifier(role)))
    with psycopg.connect(url, autocommit=True) as conn:
        for kind in ("admin", "app"):
            conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(name), sql.Identifier(roles[kind])))
        # PostgreSQL 15 and later: nobody creates in public but its owner.
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
            sql.Identifier(roles["app"])))
    inst = Installation(url, roles, Workers(url))
    inst.workers.url = inst.url("worker")
    try:
        ok(reorg(inst.url("admin"), "db", "upgrade"))
        make_items(inst.url("app"), 1_000)
        inst.as_role("app", """
            CREATE TABLE secret_table (secret text);
            INSERT INTO secret_table VALUES ('s3cret-value');
            CREATE FUNCTION peek() RETURNS text LANGUAGE plpgsql STABLE
                AS 'BEGIN RETURN (SELECT secret FROM secret_table LIMIT 1); END'""")
        # The DBA pastes what `reorg db grants` prints (as the superuser).
        script = ok(reorg(inst.url("admin"), "db", "grants", "--worker-role", roles["worker"],
                          "--user-role", roles["alice"], "--user-role", roles["bob"],
                          "--user-role", roles["carol"], "--table", "public.items"))
        execute(url, script)
        # The application's owner lets its users work on items; the worker
        # could read the secret, only bob may.
        r = roles
        inst.as_role("app", f"""
            GRANT SELECT, UPDATE ON items TO {r['alice']}, {r['bob']}, {r['carol']};
            GRANT SELECT ON secret_table TO {r['worker']}, {r['bob']}""")
        execute(url, f"REVOKE {r['carol']} FROM {r['worker']}")
        yield inst
    finally:
        inst.workers.stop_all()
        drop_database(pg_server, name)
        with psycopg.connect(pg_server, autocommit=True) as conn:
            for role in roles.values():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
