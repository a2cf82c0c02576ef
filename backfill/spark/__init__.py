"""The PySpark data plane: one SparkSession per process (``session``), JDBC
plumbing (``jdbc``), transforms (``transform``), landing Spark's output in
PostgreSQL (``landing``), the fenced merge (``merge``), and the batch engine
that runs one subtask (``engine``).

Nothing here starts Spark at import time: ``session.get_spark()`` does, once.
"""
