"""reorg's data plane and built-in job types.

One package per job type, each holding its submit-time checks, owner steps
(prepare, advance, rollback) and subtask code together:

- ``sql_update/``      ``sql-update``: PostgreSQL alone, no Spark
- ``spark_backfill/``  ``backfill``: a column computed on Spark
- ``copy/``            ``copy``: rows into another table through Spark
- ``checksum/``        ``checksum``: two tables compared range by range
- ``add_index/``       ``add-index``: an index built online, duplicates looked for first
- ``add_column/``      ``add-column``: a column with a per-row value, its default and NOT NULL

Shared by them: ``tables`` (catalogue facts and the checks of user input
against a table), ``ranged_update`` (the ranged UPDATE batch of sql-update
and add-column), ``expressions`` (user SQL fragments checked to be one
expression) and ``spark/`` (the Spark plumbing and the one batch loop).

Each job type registers itself with ``framework.jobtype`` through the
``reorg.job_types`` entry point (``<package>.job:register``). A job type's
package never imports another's, nor ``cli``. Importing this package never
starts Spark.
"""
