"""The big-table benchmark: reorg on a table of 100,000,000 rows (~7 GB).

    python -m bench.bigtable [--rows 100000000] [--db URL] [--window 180] [--doc docs/benchmarks.md]

On ``bench.items (id bigint primary key, a int, b text, c text)``, at reorg's
default settings, with one `reorg worker --slots 2`:

    submit     `reorg submit sql-update --set c=md5(b)` -> the job `running`
               (the owner's split of the whole key space; no step may scan the table)
    evenness   rows per range (min / median / max) counted in a few of the job's ranges
    rate       rows/s of the job over a fixed window against 2-connection 10k-key
               chunked SQL over a window of the same length, on the same table
    cancel     `reorg cancel` after the window -> the job `cancelled`, and the
               touched ranges checked restored (c NULL again)

A full pass over 100M rows would take hours on a shared 2-core machine, so
the rates come from equal time windows, not from whole passes.

Modules, one job each:

    command    the command line, the order of the measures
    build      the table, built fast (parallel INSERTs from generate_series, index after)
    measure    the measures above, through the `reorg` command and framework.control
    report     the "100M rows" section of docs/benchmarks.md, below the hand-kept marker
    rewrite_copy  issue 24's 100M-row figures of ``rewrite`` (submit -> running, its
               copy's rate against one ``INSERT ... SELECT``), on the same table:
               ``python -m bench.bigtable.rewrite_copy``

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""
