"""``--alter "ALTER COLUMN id TYPE bigint, ADD COLUMN d text, DROP COLUMN e"``:
the actions of one ALTER TABLE, parsed by PostgreSQL's own parser (pglast)
and split into what shapes the empty shadow (applied at once: cheap on an
empty table) and what the build step does later (an added constraint), plus
what the copy must know (a ``USING`` expression is how the column's value is
computed from T's row; a dropped constraint of T is not built).

Only actions that change the table's shape or storage are taken; anything
else (owner, triggers, replica identity, inheritance, ...) is refused: the
swap carries those over from T."""

from __future__ import annotations

from dataclasses import dataclass, field

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from framework.errors import InvalidParams

_T = enums.AlterTableType
SHAPE_ACTIONS = frozenset({
    _T.AT_AddColumn, _T.AT_DropColumn, _T.AT_AlterColumnType, _T.AT_ColumnDefault,
    _T.AT_DropNotNull, _T.AT_SetNotNull, _T.AT_SetStatistics, _T.AT_SetOptions,
    _T.AT_ResetOptions, _T.AT_SetStorage, _T.AT_SetCompression, _T.AT_AddIdentity,
    _T.AT_SetIdentity, _T.AT_DropIdentity, _T.AT_SetRelOptions, _T.AT_ResetRelOptions,
    _T.AT_SetTableSpace, _T.AT_SetLogged, _T.AT_SetUnLogged, _T.AT_DropExpression,
})
FIX = "give the actions of one ALTER TABLE, e.g. \"ALTER COLUMN id TYPE bigint, ADD COLUMN d text\""


@dataclass(frozen=True)
class AddedConstraint:
    """A constraint the --alter adds: built on the shadow after the copy."""

    name: str
    contype: str  # 'p', 'u', 'c', 'f' or 'x' (as pg_constraint.contype)
    definition: str  # the constraint's text after its name, e.g. CHECK (d <> '')
    # A FOREIGN KEY to the table itself: on the shadow, to the shadow (after
    # the swap, of the new table to itself), not to T.
    self_reference: bool = False


@dataclass(frozen=True)
class Alter:
    shape: str | None  # ALTER TABLE <shadow> ...: the actions applied to the empty shadow
    using: dict[str, str] = field(default_factory=dict)  # column -> USING expression over T
    dropped_columns: tuple[str, ...] = ()
    added: tuple[AddedConstraint, ...] = ()
    dropped_constraints: tuple[str, ...] = ()


_CONTYPES = {
    enums.ConstrType.CONSTR_PRIMARY: "p", enums.ConstrType.CONSTR_UNIQUE: "u",
    enums.ConstrType.CONSTR_CHECK: "c", enums.ConstrType.CONSTR_FOREIGN: "f",
    enums.ConstrType.CONSTR_EXCLUSION: "x",
}


def parse(text: str, shadow_schema: str, shadow_name: str, table_name: str) -> Alter:
    """The --alter ``text`` split as the module says; ``table_name`` (T's bare
    name) names an unnamed PRIMARY KEY as PostgreSQL would after the swap."""
    body = (text or "").strip().removesuffix(";").strip()
    if not body:
        raise InvalidParams(f"--alter is empty; {FIX}")
    try:
        statements = parse_sql(f"ALTER TABLE reorg_shadow {body}")
    except ParseError as exc:
        raise InvalidParams(f"--alter {body!r} does not parse ({exc}); {FIX}") from None
    stmt = statements[0].stmt if len(statements) == 1 else None
    if isinstance(stmt, ast.RenameStmt):
        raise InvalidParams(
            "--alter: a rewrite does not rename; ADD COLUMN the new name, --set new=old, "
            "DROP COLUMN the old (or rename with ALTER TABLE after)")
    if not isinstance(stmt, ast.AlterTableStmt) or not stmt.cmds:
        raise InvalidParams(f"--alter {body!r} is not the actions of one ALTER TABLE; {FIX}")
    shape, using, dropped, added, unbuilt = [], {}, [], [], []
    for cmd in stmt.cmds:
        subtype = enums.AlterTableType(cmd.subtype)
        if subtype == _T.AT_AddConstraint:
            added.append(_added(cmd.def_, shadow_schema, table_name))
            continue
        if subtype == _T.AT_DropConstraint:
            unbuilt.append(cmd.name)
            continue
        if subtype not in SHAPE_ACTIONS:
            raise InvalidParams(
                f"--alter: {_shown(cmd)} does not change the table's shape; the rewrite "
                "carries such settings over from the table: run it as ALTER TABLE after")
        if subtype == _T.AT_AlterColumnType and cmd.def_.raw_default is not None:
            # The copy's value of the column; on the empty shadow it only
            # checks that the expression gives the new type.
            using[cmd.name] = RawStream()(cmd.def_.raw_default)
        if subtype == _T.AT_DropColumn:
            dropped.append(cmd.name)
        shape.append(cmd)
    statement = None
    if shape:
        stmt.cmds = tuple(shape)
        stmt.relation = ast.RangeVar(schemaname=shadow_schema, relname=shadow_name, inh=True,
                                     relpersistence="p")
        statement = RawStream()(stmt)
    return Alter(statement, using, tuple(dropped), tuple(added), tuple(unbuilt))


def names_table(relation: ast.RangeVar | None, schema: str, name: str) -> bool:
    """Whether ``relation`` is the table ``schema.name`` (unqualified: by its name)."""
    return (relation is not None and relation.relname == name
            and relation.schemaname in (None, schema))


def _added(constraint: ast.Constraint, schema: str, table_name: str) -> AddedConstraint:
    contype = _CONTYPES.get(constraint.contype)  # type: ignore[arg-type]
    if contype is None:
        raise InvalidParams("--alter: ADD CONSTRAINT takes PRIMARY KEY, UNIQUE, CHECK, FOREIGN "
                            "KEY or EXCLUDE here")
    name = constraint.conname
    if not name and contype == "p":
        name = f"{table_name}_pkey"
    if not name:
        raise InvalidParams(
            f"--alter: an ADD {RawStream()(constraint)[:60]} has no name; name it (ADD "
            "CONSTRAINT name ...) so the rewrite builds it under that name")
    constraint.conname = None
    constraint.skip_validation = False
    constraint.initially_valid = True
    return AddedConstraint(name, contype, RawStream()(constraint),
                           contype == "f" and names_table(constraint.pktable, schema, table_name))


def _shown(cmd: ast.AlterTableCmd) -> str:
    stmt = ast.AlterTableStmt(relation=ast.RangeVar(relname="t", inh=True, relpersistence="p"),
                              cmds=(cmd,), objtype=enums.ObjectType.OBJECT_TABLE)
    return RawStream()(stmt).removeprefix("ALTER TABLE t ")
