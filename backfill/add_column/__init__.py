"""The ``add-column`` job type: a column every row gets a per-row value in,
online, then its default and NOT NULL (``job``: checks, owner steps and the
subtasks; ``ddl``: the statements of each schema state, for the job and for
its dry run).

Never imports ``backfill.spark`` or pyspark, another job type's package, or ``cli``.
"""
