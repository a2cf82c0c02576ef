"""What each package's ``__init__`` docstring says it never imports, checked
on the source (every import, at module level or inside a function)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB_TYPES = ("backfill.sql_update", "backfill.spark_backfill", "backfill.copy", "backfill.checksum",
             "backfill.alter_type", "backfill.add_index", "backfill.add_column")
# The web stack of ``reorg dashboard`` (cli.dashboard).
WEB = ("starlette", "uvicorn", "jinja2")


def _imports(package: str) -> dict[str, set[str]]:
    """module -> the modules it imports, for every module under ``package``."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        found[module] = names
    return found


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


RULES = [
    # (package, what its modules never import, modules exempt, imports allowed)
    ("framework", ("backfill", "cli"), None, None),
    ("framework", ("typer", *WEB), None, None),
    ("framework", ("framework.localpg",), "framework.localpg", None),
    ("framework.localpg", ("framework", "backfill", "cli"), None, "framework.localpg"),
    # A job type joins the `reorg` command through cli.plugin, and only it.
    ("backfill", ("cli",), "backfill.demo", "cli.plugin"),
    ("backfill.schema", JOB_TYPES, None, None),
    ("backfill.spark", JOB_TYPES, None, None),
    # The rewrite engine (issue 24), a job type's foundations: PostgreSQL alone.
    ("backfill.rewrite", JOB_TYPES, None, None),
    # ... Spark's data plane only for --engine spark, in one module.
    ("backfill.rewrite", ("backfill.spark", "pyspark"), "backfill.rewrite.spark_rows", None),
    ("backfill.sql_update", ("backfill.spark", "pyspark"), None, None),
    ("backfill.add_index", ("backfill.spark", "pyspark"), None, None),
    ("backfill.add_column", ("backfill.spark", "pyspark"), None, None),
    *[(jt, tuple(other for other in JOB_TYPES if other != jt), None, None) for jt in JOB_TYPES],
    ("cli", WEB, "cli.dashboard", None),
    # cli/ knows no job type (issue 13): they come through cli.plugin.
    ("cli", ("backfill", "pyspark"), None, None),
    ("backfill.demo", ("backfill.spark", "pyspark"), None, None),
    ("cli.dashboard", ("typer",), "cli.dashboard.command", None),
]


@pytest.mark.parametrize(("package", "never", "exempt", "allowed"), RULES)
def test_package_never_imports(package: str, never: tuple[str, ...], exempt: str | None,
                               allowed: str | None) -> None:
    bad = sorted(
        f"{module} imports {name}"
        for module, names in _imports(package).items()
        if not (exempt and _under(module, exempt))
        for name in names
        if any(_under(name, n) for n in never) and not (allowed and _under(name, allowed))
    )
    assert not bad, bad


def test_no_two_modules_import_each_other() -> None:
    """No circle of imports, not even through an import inside a function
    or under TYPE_CHECKING: each module builds on the ones below it."""
    graph: dict[str, set[str]] = {}
    for package in ("framework", "backfill", "cli", "migrations"):
        graph.update(_imports(package))
    edges = {m: {n for n in names if n in graph and n != m} for m, names in graph.items()}
    circles = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            circles.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for imported in sorted(edges[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    # A package's __init__ importing its own modules is no circle of the code's.
    circles = [c for c in circles if not any(m == c[0].rsplit(".", 1)[0] for m in c)]
    assert circles == []
