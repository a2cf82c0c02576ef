"""Keep PySpark from printing errors we handle.

PySpark 4 logs every analysis error that carries a query context as a long
JSON record on stderr (``SQLQueryContextLogger`` / ``DataFrameQueryContextLogger``)
before raising it. Submit-time validation catches those errors and turns
them into one clear line (DESIGN 11); the JSON record would bury it. So
would the JVM's log of a failed dry-run task (an ERROR with a stack trace),
so the JVM's log is off meanwhile too (back to ``session``'s ERROR level after).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


@contextlib.contextmanager
def quiet_analysis_errors() -> Iterator[None]:
    from backfill.spark.session import get_spark

    sc = get_spark().sparkContext
    # Get them through PySparkLogger, as PySpark does: a plain logger of the
    # same name would break PySpark's own logging calls (extra keywords).
    from pyspark.logger import PySparkLogger

    loggers = [PySparkLogger.getLogger(name) for name in _LOGGERS]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    sc.setLogLevel("OFF")
    try:
        yield
    finally:
        sc.setLogLevel("ERROR")
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was
