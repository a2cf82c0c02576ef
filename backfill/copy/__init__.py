"""The ``copy`` job type: rows copied into another table through Spark SQL
select expressions, range by range.

``job``: owner steps; ``submit``: submit-time checks of the selects and the
target; ``batches``: the staging, fenced upsert and key bookkeeping of a
batch on the shared batch loop (``backfill.spark.pipeline``).

Never imports another job type's package, or ``cli``; starts no Spark at
import time.
"""
