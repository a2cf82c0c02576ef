"""The ``sql-update`` job type: a column set from a PostgreSQL expression,
range by range, in PostgreSQL alone (``job``: checks, owner steps and the
batch loop; ``statements``: the SQL of a batch, of before-images and of
rollback).

Never imports ``backfill.spark`` or pyspark (it runs where no JVM is
installed), another job type's package, or ``cli``.
"""
