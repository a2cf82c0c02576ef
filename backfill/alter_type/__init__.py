"""``alter-type``: ``ALTER TABLE T ALTER COLUMN C TYPE TYPE [USING EXPR]``
without the long lock, in TiDB's schema states::

    reorg submit alter-type --table T --column C --type TYPE [--using EXPR]

    write-only      prepare: shadow column C_reorg_new TYPE, NOT VALID checks,
                    trigger (every INSERT/UPDATE sets the shadow column)
    write-reorg     backfill (ranges) ─► verify (ranges) ─► build-indexes (fixed:
                    CREATE INDEX CONCURRENTLY per index on C; VALIDATE; ANALYZE)
    public          cut-over: one short transaction swaps the columns
    rollback        from any state: drop trigger and shadow column (its
                    indexes and constraints go with it); C was never touched

Modules: ``checks`` (what submit refuses), ``plan`` (each state's DDL, the
dry run), ``batches`` (the workers' side), ``cutover``, ``names``, ``job``
(the planner and executor, registered through the ``reorg.job_types``
entry point), ``options`` (the ``reorg submit alter-type`` options).
Shared helpers live in ``backfill.schema``.
"""
