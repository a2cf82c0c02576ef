"""The engine of an online table rewrite (issue 24; DESIGN "Table rewrite
(shadow table) jobs"): T copied into a shadow table of the new shape, kept
in step by a change log, and swapped in one short transaction.

Foundations, each usable on a connection alone (no worker, no owner):

- ``names``      what a job creates, named from its id (63 bytes at most)
- ``shadow``     the plan: the shadow table in the new shape (repack,
                 --order-by, --alter, --like, --set), the copy's column
                 mapping and batch statement, checked at submit by doing it
                 in a savepoint; with ``alter`` and ``like`` (the two forms'
                 parsers) and ``builds`` (indexes and constraints made after
                 the copy)
- ``capture``    the change log: its table, the AFTER ROW trigger on T, the
                 replay of logged keys into the shadow, the backlog
- ``carry``      what the swap makes again on the new table (with ``views``
                 and ``grants``); ``uncarried``: what it cannot, one line each
- ``swap``       the swap and revert transactions, rollback and cleanup
                 statements; ``reverse``: the --keep-old reverse capture
- ``qualified``  catalogue definitions read with schema-qualified names
- ``spark_rows`` ``--engine spark``: the rows the copy and the replays write,
                 their --set column computed on Spark (the backfill data
                 plane, ``backfill.spark``)

Imports nothing of another job type, and nothing of Spark but in
``spark_rows`` (imported by the others only inside the functions that
run a job on Spark).
"""
