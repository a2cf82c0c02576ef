"""Privileges set on a relation entry by entry, each granted by its
grantor, to match another relation's (``carry``, ``views``)."""

from __future__ import annotations

# A role as GRANT names it, of an aclexplode column.
ROLE = "CASE WHEN {0} = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid({0})) END"

# Every privilege held on relation :t, the owner's defaults included, the
# owner's grants first (so a grant option exists before another role uses it).
ACL = f"""
    SELECT {ROLE.format('a.grantor')}, {ROLE.format('a.grantee')}, a.privilege_type,
           a.is_grantable
    FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
    WHERE c.oid = to_regclass(:t)
    ORDER BY a.grantor <> c.relowner, 1, 2, 3"""


def statements(owner: str, me: str, revoke: list[str],
               entries: list[tuple[str, str, bool]]) -> list[str]:
    """The ``revoke`` statements, then each ``(grantor, GRANT ..., grantable)``
    granted by its grantor: PostgreSQL 15 records the current role as the
    grantor, so a grant of another role than the owner is made under
    ``SET LOCAL ROLE`` to it (``me``: the role to return to)."""
    made = list(revoke)
    for grantor, grant, grantable in entries:
        option = " WITH GRANT OPTION" if grantable else ""
        if grantor == owner:
            made.append(grant + option)
        else:
            made += [f"SET LOCAL ROLE {grantor}", grant + option, f"SET LOCAL ROLE {me}"]
    return made


def revoke_all(relation: str, owner: str, held: set[str]) -> list[str]:
    """Every privilege on ``relation`` revoked: of each role in ``held`` and
    of the owner (a first GRANT makes its default privileges explicit)."""
    return [f"REVOKE ALL ON {relation} FROM {grantee}" for grantee in sorted(held | {owner})]
