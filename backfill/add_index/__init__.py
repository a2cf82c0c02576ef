"""The ``add-index`` job type: an index built under the job (``CREATE INDEX
CONCURRENTLY``), for ``--unique`` after subtasks looked for duplicate keys
(``job``: checks, owner steps and both steps' subtasks; ``build``: the
concurrent build, its progress and its takeover by a new lease holder;
``duplicates``: the duplicate-key search).

Never imports ``backfill.spark`` or pyspark, another job type's package, or ``cli``.
"""
