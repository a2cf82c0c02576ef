"""reorg's data plane and built-in job types.

``sql_update`` runs in PostgreSQL alone; ``spark/`` is the PySpark data plane
used by ``backfill``, ``copy`` and ``checksum``. Each job type registers itself
with ``framework.jobtype`` through the ``reorg.job_types`` entry point.
Importing this package never starts Spark.
"""
