"""The PySpark plumbing the Spark job types share: one SparkSession per
process (``session``, with its class-data archive ``cds``), JDBC reads
(``jdbc``), landing Spark's output in PostgreSQL (``landing``), Spark and
PostgreSQL types (``compat``), batch sizing (``sizing``), failures in one
line (``failures``), submit-time checks (``validation``, ``quiet``), the
per-row expression with its Python UDF (``transform``: ``backfill``'s and
``rewrite --engine spark``'s) and the one batch loop that runs a subtask
(``pipeline``).

What a batch is lives with each job type: ``backfill.spark_backfill.batches``,
``backfill.copy.batches``, ``backfill.checksum.batches``. This package never
imports a job type's package, nor ``cli``.

Nothing here starts Spark at import time: ``session.get_spark()`` does, once.
"""
