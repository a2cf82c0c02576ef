"""The per-row transform: a Spark SQL expression over the row's columns,
which may call a Python function given as ``module:function`` (registered
under the function's name, e.g. ``--udf mylib:normalise --set c=normalise(b)``).

Every batch becomes the same columns, in the order the staging table has
them (``MergeSql.stage_columns``): ``k`` (key; ``k0``, ``k1``, ... for a key
of any type, as PostgreSQL's text of each column), ``ver`` (row version read)
and ``new`` (computed value). The old value never travels through
Spark: its types do not carry every PostgreSQL value exactly, so the merge
takes before-images inside PostgreSQL (``merge``). Spark prunes the target
column from the read unless the expression uses it.
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from backfill.spark.expression_guard import check_spark_expression
from backfill.spark.jdbc import VERSION_COLUMN
from backfill.spark.keyset_read import TEXT_KEY_PREFIX
from backfill.spark.pipeline import spark_column
from backfill.spark.session import on_session_stop
from framework.keys import KeySpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

_registered: set[tuple[str, str]] = set()
_lock = threading.Lock()
on_session_stop(_registered.clear)


class UdfError(ValueError):
    pass


# Modules whose functions reach the process, its files, the network or other
# code: never a UDF a submitter may name (the function runs as the worker's OS
# user, with the worker's environment and database URL). A floor only:
# REORG_UDF_MODULES, set on every worker, lists the modules allowed instead.
_NEVER_UDF_MODULES = frozenset({
    "builtins", "os", "posix", "nt", "sys", "subprocess", "shutil", "socket", "ssl", "io",
    "codecs", "pathlib", "glob", "fileinput", "tempfile", "importlib", "pkgutil", "runpy",
    "ctypes", "pty", "signal", "resource", "multiprocessing", "threading", "pickle", "marshal",
    "shelve", "dbm", "sqlite3", "code", "codeop", "pdb", "webbrowser", "urllib", "http",
    "ftplib", "smtplib", "asyncio", "selectors", "mmap", "gc", "inspect", "platform",
    "psycopg", "sqlalchemy", "pyspark", "py4j", "framework", "backfill", "cli",
})


def udf_module_allowed(module_name: str, allowed: str | None = None) -> bool:
    """Whether a submitter may name a function of ``module_name`` as a UDF:
    only the modules (and their submodules) in ``REORG_UDF_MODULES`` when it
    is set (comma-separated), else any but the ones that reach the process."""
    listed = os.environ.get("REORG_UDF_MODULES") if allowed is None else allowed
    if listed is not None and listed.strip():
        names = {m.strip() for m in listed.split(",") if m.strip()}
        return any(module_name == m or module_name.startswith(m + ".") for m in names)
    return module_name.split(".")[0].lstrip("_") not in _NEVER_UDF_MODULES


def load_udf(spec: str) -> tuple[str, Callable[..., Any]]:
    """``module:function`` -> (function name, function); a one-line error otherwise."""
    module_name, sep, func_name = (spec or "").partition(":")
    if not sep or not module_name or not func_name.isidentifier():
        raise UdfError(f"--udf {spec!r} is not MODULE:FUNCTION, e.g. --udf mylib.clean:normalise")
    if not udf_module_allowed(module_name):
        raise UdfError(
            f"--udf {spec!r}: module {module_name} is not allowed for UDFs (its functions "
            "reach the worker's process, files or network); name a function of your own "
            "module, allowed on the workers through REORG_UDF_MODULES")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UdfError(f"--udf: cannot import {module_name} ({exc}); put it on PYTHONPATH") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UdfError(f"--udf: {module_name} has no function {func_name}")
    defined_in = getattr(func, "__module__", None) or module_name
    if not udf_module_allowed(defined_in):  # re-exported, e.g. mylib:system from os
        raise UdfError(
            f"--udf {spec!r}: the function comes from module {defined_in}, which is not "
            "allowed for UDFs; name a function of your own module")
    return func_name, func


def _installed(module: ModuleType) -> bool:
    """True for the standard library and installed packages: executors have
    those already, and pickling their functions by value would be wrong."""
    origin = getattr(module, "__file__", None)
    if not origin or module.__name__ == "__main__":
        return True  # builtins; __main__ is pickled by value anyway
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(str(Path(origin).resolve()).startswith(str(Path(r).resolve())) for r in roots)


@dataclass(frozen=True)
class Transform:
    column: str  # target column, unquoted
    expr: str  # Spark SQL expression
    udf: str | None = None  # module:function, callable from expr by its function name

    def register(self, spark: SparkSession, return_type: DataType) -> None:
        """Make the UDF callable from Spark SQL (once per session and type)."""
        if not self.udf:
            return
        token = (self.udf, return_type.json())
        with _lock:
            if token in _registered:
                return
            name, func = load_udf(self.udf)
            # Ship the module's code with the function, so Python workers (and
            # cluster executors) need not have it on their path.
            from pyspark import cloudpickle

            module = sys.modules.get(getattr(func, "__module__", ""), None)
            if module is not None and not _installed(module):
                cloudpickle.register_pickle_by_value(module)
            spark.udf.register(name, func, return_type)
            _registered.add(token)

    def output(self, df: DataFrame, key: KeySpec, target_type: DataType) -> DataFrame:
        """The batch rows as the stage's key columns (``KeySpec.work_key``),
        ver, new; ``new`` cast to the target's Spark type. A single integer
        key is Spark's number; any other key each column's PostgreSQL text,
        read alongside (``keyset_read.text_columns``)."""
        from pyspark.sql import functions as F

        # Again on the worker: a job row need not come from submit.
        check_spark_expression(df.sparkSession, self.expr, "--set")
        staged = key.work_key().columns
        read = ([key.columns[0]] if key.arithmetic
                else [f"{TEXT_KEY_PREFIX}{i}" for i in range(len(key.columns))])
        key_columns = [spark_column(r).alias(s) for r, s in zip(read, staged, strict=True)]
        return df.select(*key_columns, F.col(VERSION_COLUMN).alias("ver"),
                         F.expr(self.expr).cast(target_type).alias("new"))
