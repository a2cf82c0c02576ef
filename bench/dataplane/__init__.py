"""The data-plane benchmark: reorg's backfill against a hand-written PySpark job
and plain SQL, on one table, in one run.

    python -m bench.dataplane [--rows 2000000] [--db URL] [--skip-reorg]
                              [--job-type backfill|sql-update|both] [--doc docs/benchmarks.md]

One table ``bench.items (id bigint primary key, a int, b text, c text)`` of N
rows, and the same change ``c = md5(b)`` made by each contender:

    (1) reorg         `reorg submit backfill --table bench.items --set c=md5(b)` on one
                      `reorg worker --slots 2`, timed from submit to `reorg wait` exit 0
    (2) plain Spark   plain_spark.py: JDBC read (partitioned on id), md5 in Spark,
                      JDBC write to a staging table, one UPDATE ... FROM staging
    (3) chunked SQL   UPDATE in 10,000-key chunks from two autocommit connections
    (4) one UPDATE    UPDATE bench.items SET c = md5(b), for reference

Before every contender the table is put back into one physical state
(``server.reset_table``), and after it every row is checked against md5(b).
Then a further reorg run is killed with SIGKILL at ~40 % and resumed by
another worker, to count the rows processed twice.

Modules, one job each:

    command      the command line: arguments, the order of the contenders, the report
    server       the PostgreSQL server (throwaway or --db), the table, reset and checks
    serverlog    the server's statement log: Spark's JDBC range reads (kill -9 run)
    timing       timed laps, and running a contender fairly on a shared machine
    baselines    contenders (2), (3) and (4)
    plain_spark  contender (2) itself, run as its own process
    reorg_cli    the `reorg` command as a subprocess: submit, wait, the Spark archive
    workers      `reorg worker` processes: start, wait until ready, stop, kill -9
    workerlog    what a worker's log says: Spark ready, per-batch figures (JSON)
    tracking     a job as reorg's own functions report it (framework.control, store)
    reorg_runs   contender (1): one timed job, a worker's first and second job
    kill_run     the kill -9 run and what it re-processed
    records      the benchmark's parameters and result records
    report       the summary printed at the end and docs/benchmarks.md
    proctree     process trees, memory and CPU time from /proc

Tools of their own, run with ``python -m bench.dataplane.NAME``:

    batch_profile        where an ``sql-update`` batch's time goes, by statement
    spark_batch_profile  where a ``backfill`` batch's time goes, by stage, and CPU by process
    sql_update_ab        ``sql-update``'s ratios for a baseline checkout and this one, taking turns
    backend_cpu          CPU of every PostgreSQL backend during reorg's job and chunked SQL

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""
