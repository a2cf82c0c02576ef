"""The ``checksum`` job type: two tables compared range by range; read-only.

``job``: submit-time checks and (empty) owner steps; ``batches``: how a range
is compared, in PostgreSQL or on Spark, on the shared batch loop
(``backfill.spark.pipeline``); ``report``: a job's findings summed up.

Never imports another job type's package, or ``cli``; starts no Spark at
import time.
"""
