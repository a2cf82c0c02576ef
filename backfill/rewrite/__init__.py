"""The engine of an online table rewrite (issue 24; DESIGN "Table rewrite
(shadow table) jobs"): T copied into a shadow table of the new shape, kept
in step by a change log, and swapped in one short transaction.

Foundations, each usable on a connection alone (no worker, no owner):

- ``names``    what a job creates, named from its id
- ``shadow``   the shadow table in the new shape (repack, --order-by,
               --alter, --like, --set), the copy's column mapping and batch
               statement, the indexes and constraints to build later, and
               what is refused at submit
- ``capture``  the change log: its table, the AFTER ROW trigger on T, the
               replay of logged keys into the shadow, the backlog
- ``carry``    what the swap carries from T to the new table (grants,
               triggers, policies, publications, views, foreign keys, ...),
               read from the catalogue, and what it cannot carry
- ``swap``     the swap transaction, the reverse capture of --keep-old, and
               the revert

Imports nothing of another job type and nothing of Spark.
"""
