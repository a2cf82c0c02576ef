"""The PySpark data plane: one SparkSession per process (``session``), JDBC
plumbing (``jdbc``), transforms (``transform``), landing Spark's output in
PostgreSQL (``landing``), the fenced merge (``merge``), the batch loop that
runs one subtask (``pipeline``) and what a batch is for each job type:
``backfill`` (``engine``), ``copy`` (``copying``), ``checksum`` (``comparing``).

Nothing here starts Spark at import time: ``session.get_spark()`` does, once.
"""
