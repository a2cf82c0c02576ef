"""``cli.coercion``: plain option values converted without pydantic give what
typer's own conversion gives, value for value and error for error, and a
plain ``reorg`` command line never imports pydantic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A typer app with an option of every kind reorg's commands have; prints what
# typer handed the command (values and their types), or typer's error.
_APP = r'''
import enum, json, sys
from typing import Annotated
import typer
if sys.argv[1].startswith("fast"):
    from cli import coercion
    assert coercion.install()

class Kind(enum.Enum):
    a = "a"
    b = "b"

app = typer.Typer()

@app.command()
def cmd(
    i: Annotated[int, typer.Option()] = 0,
    o: Annotated[int | None, typer.Option()] = None,
    f: Annotated[float, typer.Option()] = 1,
    s: Annotated[str, typer.Option()] = "x",
    b: Annotated[bool, typer.Option("--b/--no-b", envvar="T_B")] = False,
    l: Annotated[list[str] | None, typer.Option()] = None,
    r: Annotated[int, typer.Option(min=1, max=5)] = 1,
    g: Annotated[float, typer.Option(min=0.05)] = 1.0,
    e: Annotated[Kind, typer.Option()] = Kind.a,
) -> None:
    shown = {k: [repr(v), type(v).__name__] for k, v in locals().items()}
    print(json.dumps({"ok": shown, "pydantic": "pydantic" in sys.modules}))

plain = typer.Typer()

@plain.command()
def only_plain(i: Annotated[int, typer.Option()] = 0, f: Annotated[float, typer.Option()] = 1,
               s: Annotated[str, typer.Option()] = "x",
               r: Annotated[int, typer.Option(min=1, max=5)] = 1) -> None:
    print(json.dumps({"ok": [i, f, s, r], "pydantic": "pydantic" in sys.modules}))

def run(args):
    try:
        chosen = plain if sys.argv[1].endswith("plain") else app
        typer.main.get_command(chosen)(args=args, standalone_mode=False)
    except Exception as exc:
        print(json.dumps({"error": exc.format_message() if hasattr(exc, "format_message")
                          else str(exc)}))

if sys.argv[1].endswith("many"):  # a JSON list of command lines, one line printed each
    for args in json.loads(sys.argv[2]):
        run(args)
else:
    run(sys.argv[2:])
'''

ARGS = [
    [],
    ["--i", "7", "--o", "-3", "--f", "2", "--s", "public.items", "--r", "5", "--g", "0.05"],
    ["--i", "007", "--f", "1.5", "--l", "a", "--l", "b=c", "--b"],
    ["--i", " 7"], ["--i", "1e3"], ["--i", "abc"], ["--i", ""], ["--i", "1.0"],
    ["--f", "1e3"], ["--f", "inf"], ["--f", "-0.5"], ["--f", "x"], ["--f", ".5"],
    ["--r", "0"], ["--r", "6"], ["--r", "x"], ["--g", "0.01"], ["--g", "0"],
    ["--e", "b"], ["--e", "c"], ["--s", ""], ["--no-b"],
    ["--i", "99999999999999999999999"],
]


def _run(mode: str, args: list[str], env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", _APP, mode, *args], capture_output=True,
                         text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def converted() -> dict[str, list[dict]]:
    """Every line of ARGS through each conversion, in one process a conversion."""
    def run_many(mode: str) -> list[dict]:
        out = subprocess.run([sys.executable, "-c", _APP, mode, json.dumps(ARGS)],
                             capture_output=True, text=True, check=True).stdout
        return [json.loads(line) for line in out.strip().splitlines()]
    return {"fast": run_many("fast-many"), "full": run_many("full-many")}


@pytest.mark.parametrize("n", range(len(ARGS)), ids=lambda n: " ".join(ARGS[n]) or "defaults")
def test_plain_conversion_gives_what_typer_gives(converted, n):
    fast, full = converted["fast"][n], converted["full"][n]
    assert len(converted["fast"]) == len(converted["full"]) == len(ARGS)
    fast.pop("pydantic", None), full.pop("pydantic", None)
    assert fast == full


def test_a_bool_from_the_environment_goes_through_typer():
    import os

    env = {**os.environ, "T_B": "yes"}
    assert _run("fast", [], env)["ok"]["b"] == _run("full", [], env)["ok"]["b"] == [
        "True", "bool"]


def test_plain_values_never_import_pydantic():
    args = ["--i", "7", "--f", "0.5", "--s", "public.items", "--r", "5"]
    assert _run("fast-plain", args) == {"ok": [7, 0.5, "public.items", 5], "pydantic": False}
    assert _run("full-plain", args)["pydantic"] is True  # what the shortcut saves
    # An enum option (`reorg worker --log-format`) goes through typer's own.
    assert _run("fast", ["--e", "b"])["pydantic"] is True
