"""reorg's data plane and built-in job types.

One package per job type, each holding its submit-time checks, owner steps
(prepare, advance, rollback) and subtask code together:

- ``sql_update/``      ``sql-update``: PostgreSQL alone, no Spark
- ``spark_backfill/``  ``backfill``: a column computed on Spark
- ``copy/``            ``copy``: rows into another table through Spark
- ``checksum/``        ``checksum``: two tables compared range by range
- ``alter_type/``      ``alter-type``: a column's type changed online (shadow
                       column, trigger, one short cut-over)
- ``add_index/``       ``add-index``: an index built online, duplicates looked for first
- ``add_column/``      ``add-column``: a column with a per-row value, its default and NOT NULL

Shared by them: ``tables`` (catalogue facts and the checks of user input
against a table), ``ranged_update`` (the ranged UPDATE batch of sql-update
and add-column), ``expressions`` (user SQL fragments checked to be one
expression), ``spark/`` (the Spark plumbing and the one batch loop) and
``schema/`` (online schema changes: a column's catalogue facts, index and
constraint definitions moved to another column, the shadow column's trigger).

Each job type registers itself with ``framework.jobtype`` through the
``reorg.job_types`` entry point (``<package>.job:register``), and brings its
own ``reorg submit TYPE`` options (``<package>/options.py``, named by the
type's ``submit_options``) and commands (``checksum/cli.py``, through the
``reorg.commands`` entry point). A job type's package never imports
another's, nor ``cli`` except ``cli.plugin`` (the CLI's one API for job
types). Importing this package never starts Spark.
"""
