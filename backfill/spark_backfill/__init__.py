"""The ``backfill`` job type: a column set from a Spark SQL expression (with
an optional Python UDF), range by range on Spark.

``job``: submit-time checks and owner steps; ``batches``: a subtask's batches
on the shared batch loop (``backfill.spark.pipeline``), each row's value by
``backfill.spark.transform``; ``merge``: the SQL of the fenced merge and of
rollback.

Never imports another job type's package, or ``cli``; starts no Spark at
import time.
"""
