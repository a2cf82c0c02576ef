"""How the data-plane benchmark reports: the machine description, the summary
printed at the end and the markdown written to docs/benchmarks.md (the part a
run writes; what follows ``KEPT_MARK`` there is kept by hand and left alone)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from bench.dataplane.proctree import SAMPLE_SECONDS
from bench.dataplane.records import (
    ADD_COLUMN_TO_CHUNKED,
    BACKFILL_TO_SPARK_JOB,
    CHUNK_ROWS,
    JUDGED,
    KILL_AT,
    OVERWRITE_TO_CHUNKED,
    SPARK_PARTITIONS,
    SQL_CONNECTIONS,
    SUBMIT_SECONDS,
    TABLE,
    TARGETS,
    WORKER_SLOTS,
    ReorgRun,
    Results,
)


def machine(pg_version: str) -> dict[str, str]:
    """The machine description for the report; ``pg_version`` is ``SELECT version()``."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal:"))
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    return {
        "CPUs (nproc)": str(os.cpu_count()),
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "CPU model": cpu,
        "PostgreSQL": pg_version.split(" on ")[0],
        "Java": (java.stderr or java.stdout).splitlines()[0] if java.returncode == 0 else "not found",
        "pyspark": importlib.metadata.version("pyspark"),
        "Python": platform.python_version(),
        "kernel": platform.release(),
    }


def commit() -> str:
    """The checkout's commit, for the report ("unknown" outside a git checkout)."""
    done = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else "not met"


def summary_lines(res: Results) -> list[str]:
    """The results as printed to stdout."""
    ps = res.plain_spark

    def others(seconds: float | None) -> str:
        return "" if seconds is None else f"  [other processes' CPU meanwhile: {seconds:.1f} s]"

    out = [f"rows: {res.rows:,}",
           "(1) reorg, per run (`reorg submit --wait` -> exit 0):" if res.reorg_runs
           else "(1) reorg: skipped"]
    for run in res.reorg_runs:
        out.append(f"      {run.job_type:<10} {run.label}: {run.total:7.2f} s  "
                   f"(submit {run.submit:.2f} s, worker peak RSS {mib(run.peak_rss)})"
                   + others(run.others_cpu))
    out += [f"(2) plain Spark:     {ps.with_session:7.2f} s incl. SparkSession start "
            f"({ps.job:.2f} s without, {ps.process:.2f} s process)"
            + others(res.others_cpu.get("plain Spark")),
            f"(3) chunked SQL:     {res.chunked_sql:7.2f} s" + others(res.others_cpu.get("chunked SQL")),
            f"(4) one UPDATE:      {res.single_update:7.2f} s" + others(res.others_cpu.get("one UPDATE"))]
    for run in (r for r in res.reorg_runs if r.label == JUDGED):
        for name, base in res.baselines().items():
            ratio = run.total / base
            out.append(f"reorg {run.job_type} ({run.label} job) / {name}: {ratio:.2f}  "
                       f"(target <= {TARGETS[name]}: {verdict(ratio, TARGETS[name])})")
    out += [f"issue 9: {measure}: {value} (target {target}: {met})"
            for measure, value, target, met in issue9_rows(res)]
    if res.kill:
        k = res.kill
        read = "n/a" if k.rows_read is None else f"{k.rows_read - res.rows:,}"
        batches = "n/a" if k.rows_read is None else [len(s.lost_batches()) for s in k.in_flight]
        out.append(f"kill -9 ({k.job_type}): {k.rows_updated - res.rows:,} rows written twice, "
                   f"{read} rows read twice; lost batches per in-flight subtask: {batches}")
    return out


Add = Callable[[str], None]  # appends one markdown block to the report


def write_doc(res: Results, path: Path) -> None:
    blocks: list[str] = []
    add = blocks.append
    add("# Benchmarks\n")
    add(f"Written by `{res.command}` at commit {commit()} on {res.started} "
        f"(the whole run took {res.wall / 60:.1f} min). Every run rewrites the part down to "
        "the hand-kept section at the end; see `bench/README.md`.\n")
    add("## Machine\n")
    add("| | |\n| --- | --- |")
    for key, value in res.machine.items():
        add(f"| {key} | {value} |")
    add(f"| database | {res.server} |\n")
    write_times_section(res, add)
    write_issue9_section(res, add)
    write_ratios_section(res, add)
    if res.reorg_runs:
        write_reorg_section(res, add)
    if res.kill:
        write_kill_section(res, add)
    add("## Method\n")
    add(METHOD)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(blocks).rstrip() + "\n" + kept_part(path))


# Everything after this line in the report is written by hand (figures measured
# apart from this benchmark) and survives every run.
KEPT_MARK = "<!-- Below: kept by hand; `python -m bench.dataplane` rewrites only what is above. -->"


def kept_part(path: Path) -> str:
    """The hand-kept tail of an existing report, from KEPT_MARK on, or ''."""
    old = path.read_text() if path.exists() else ""
    at = old.find(KEPT_MARK)
    return "" if at < 0 else "\n" + old[at:]


RUN_NAMES = {
    "first": "the worker's first job",
    "second": "the worker's second job",
    "overwrite": "overwriting c that holds old values (a before-image per row)",
    "add-column": "`--set d=md5(b) --add-column d:text` (no images)",
}


def write_times_section(res: Results, add: Add) -> None:
    ps = res.plain_spark
    add("## Wall times\n")
    add(f"One table `{TABLE} (id bigint primary key, a int, b text, c text)`, {res.rows:,} rows, "
        "`b = 'item ' || id`; every contender sets `c = md5(b)` on all rows and is checked "
        f"row by row afterwards (all passed). Building the table took {res.table_build:.1f} s.\n")

    def cpu(seconds: float | None) -> str:
        return "n/a" if seconds is None else f"{seconds:.1f} s"

    add("| contender | wall time | other processes' CPU meanwhile |\n| --- | ---: | ---: |")
    for run in res.reorg_runs:
            add(f"| (1) reorg `{run.job_type}`, {RUN_NAMES.get(run.label, run.label)}: `reorg submit "
            f"--wait` → exit 0 | {run.total:.2f} s | {cpu(run.others_cpu)} |")
    add(f"| (2) plain PySpark, incl. SparkSession start | {ps.with_session:.2f} s | "
        f"{cpu(res.others_cpu.get('plain Spark'))} |")
    add(f"| (2) plain PySpark, session already started | {ps.job:.2f} s | |")
    add(f"| (2) plain PySpark, whole process (`python plain_spark.py`) | {ps.process:.2f} s | |")
    add(f"| (3) SQL, {CHUNK_ROWS:,}-key chunks, {SQL_CONNECTIONS} connections | "
        f"{res.chunked_sql:.2f} s | {cpu(res.others_cpu.get('chunked SQL'))} |")
    if res.chunked_sql_old is not None:
        add(f"| (3) the same on the table with c holding old values | {res.chunked_sql_old:.2f} s "
            f"| {cpu(res.others_cpu.get('chunked SQL, old values'))} |")
    if res.chunked_sql_images is not None:
        add(f"| (3) the same, each chunk also writing sql-update's before-images (floor of "
            f"an overwrite) | {res.chunked_sql_images:.2f} s "
            f"| {cpu(res.others_cpu.get('chunked SQL with before-images, old values'))} |")
    add(f"| (4) one `UPDATE {TABLE} SET c = md5(b)` | {res.single_update:.2f} s | "
        f"{cpu(res.others_cpu.get('one UPDATE'))} |\n")
    add(f"The machine has {res.machine['CPUs (nproc)']} CPUs and is shared: the last column is "
        "the CPU time that processes other than the benchmark, its workers and its PostgreSQL "
        "server used during each contender (n/a with `--db`). Where it is a sizeable share of "
        "2 × the wall time, that contender's figure is pessimistic.\n")
    add(f"(2) in parts: SparkSession start {ps.session_start:.2f} s, JDBC read + md5 + JDBC write "
        f"to staging {ps.read_transform_write:.2f} s, `ANALYZE` + `UPDATE ... FROM` staging "
        f"{ps.update:.2f} s.\n")


def run_of(res: Results, job_type: str, label: str) -> ReorgRun | None:
    return next((r for r in res.reorg_runs if r.job_type == job_type and r.label == label), None)


def issue9_rows(res: Results) -> list[tuple[str, str, str, str]]:
    """(measure, value, target, met) of issue 9's data-plane targets that this
    run measured."""
    rows = []

    def ratio(name: str, run: ReorgRun | None, base: float | None, target: float) -> None:
        if run is not None and base:
            value = run.total / base
            rows.append((name, f"{value:.2f} ({run.total:.2f} s / {base:.2f} s)", f"≤ {target}",
                         verdict(value, target)))

    ratio("`backfill` (second job) / (2) plain Spark, session start excluded",
          run_of(res, "backfill", "second"), res.plain_spark.job, BACKFILL_TO_SPARK_JOB)
    ratio("`sql-update` overwriting old values (images kept) / (3) on the same old values",
          run_of(res, "sql-update", "overwrite"), res.chunked_sql_old, OVERWRITE_TO_CHUNKED)
    ratio("`sql-update --add-column` / (3)", run_of(res, "sql-update", "add-column"),
          res.chunked_sql, ADD_COLUMN_TO_CHUNKED)
    for job_type, seconds in res.submit_times.items():
        value = statistics.median(seconds)
        rows.append((f"`reorg submit {job_type}` wall time, median of {len(seconds)}",
                     f"{value:.2f} s (" + ", ".join(f"{x:.2f}" for x in seconds) + ")",
                     f"≤ {SUBMIT_SECONDS} s", "met" if value <= SUBMIT_SECONDS else "not met"))
    if res.kill is not None:
        k = res.kill
        # The target is on writes: a batch merges and commits with its
        # checkpoint alone, so a kill rolls back at most the batch each slot
        # was merging (n_tup_upd counts those rolled-back rows too). A Spark
        # read may cover several batches: re-reads are shown apart.
        rewritten = k.rows_updated - res.rows
        slots = max(len(k.in_flight), 1)
        rows.append((f"rows written again after kill -9 (`{k.job_type}`), in all / per slot "
                     f"({slots} in flight)", f"{rewritten:,} / {rewritten / slots:,.0f}",
                     f"≤ {k.batch_rows:,} (`--batch-rows`) per slot",
                     "met" if rewritten <= k.batch_rows * slots else "not met"))
        if k.rows_read is not None:
            per_slot = [s.lost_rows for s in k.in_flight]
            rows.append((f"rows read again after kill -9 (`{k.job_type}`), most per slot / in all",
                         f"{max(per_slot, default=0):,} / {k.rows_read - res.rows:,}",
                         "none (a Spark read covers up to `batches_per_read` batches)",
                         "reported"))
    return rows


def write_issue9_section(res: Results, add: Add) -> None:
    rows = issue9_rows(res)
    if not rows:
        return
    add("## Targets of issue 9\n")
    add("| measure | value | target | |\n| --- | ---: | ---: | --- |")
    for row in rows:
        add("| " + " | ".join(row) + " |")
    add("")
    if res.chunked_sql_images and res.chunked_sql_old:
        add(f"Floor of an overwrite: PostgreSQL alone, writing the same before-images from the "
            f"same chunks and connections, takes {res.chunked_sql_images:.2f} s, "
            f"{res.chunked_sql_images / res.chunked_sql_old:.2f}x (3) on the same old values; "
            "reorg's batches add their checkpoints, key scans and its fixed costs (submit, "
            "the owner's split, the wait for the job's end) on top.\n")
    if res.stack_import and res.chunked_sql:
        floor = res.chunked_sql + res.stack_import
        add(f"Floor of an add-column: (3) plus the start of a Python process that only imports "
            f"reorg's CLI stack (SQLAlchemy with psycopg, typer; {res.stack_import:.2f} s, before "
            f"any statement `reorg submit` sends), {floor:.2f} s, {floor / res.chunked_sql:.2f}x "
            "(3); the owner's prepare, the batches' checkpoints and the end of the job come on "
            "top.\n")


def write_ratios_section(res: Results, add: Add) -> None:
    add("## Ratios against the targets of issue 3\n")
    if not res.reorg_runs:
        add("reorg was skipped (`--skip-reorg`).\n")
        return
    add("| ratio | value | target | |\n| --- | ---: | ---: | --- |")
    for run in res.reorg_runs:
        for name, base in res.baselines().items():
            ratio = run.total / base
            add(f"| reorg `{run.job_type}` ({run.label} job) / {name} | {ratio:.2f} | "
                f"≤ {TARGETS[name]} | {verdict(ratio, TARGETS[name])} |")
    add("")
    add(f"The targets are judged on the worker's **{JUDGED}** job: a worker is a long-running "
        "service whose SparkSession is up before jobs arrive (its start-up is reported below); "
        "its first job also warms the JVM's code paths, the JDBC driver and reorg's per-job "
        "caches. (2) is taken with its SparkSession start, since a hand-written job starts Spark "
        "every time; that is the smaller of its two process-level figures, so the ratio errs "
        "against reorg.\n")


def write_reorg_section(res: Results, add: Add) -> None:
    runs = res.reorg_runs
    add("## Where the time goes in a reorg run\n")
    add("| | " + " | ".join(f"`{r.job_type}` {r.label}" for r in runs) + " |")
    add("| --- |" + " ---: |" * len(runs))

    def row(name: str, values: list[str]) -> None:
        add(f"| {name} | " + " | ".join(values) + " |")

    row("`reorg submit` command (its own process)", [f"{r.submit:.2f} s" for r in runs])
    row("submit start → job row committed (the CLI's start and PostgreSQL-side checks; "
        "a Spark type's analysis follows on the owner, waited for by the submit)",
        [f"{r.created:.2f} s" for r in runs])
    row("job queued → running (owner prepares, splits)", [f"{r.queued:.2f} s" for r in runs])
    row("submit start → first batch committed", [f"{r.first_commit:.2f} s" for r in runs])
    row("first subtask start → last subtask end", [f"{r.processing:.2f} s" for r in runs])
    row("last subtask end → `reorg submit --wait` returned", [f"{r.finish:.2f} s" for r in runs])
    row("subtasks", [str(r.subtasks) for r in runs])
    row("worker SparkSession start in this run",
        [f"{r.spark_start:.2f} s" if r.spark_start is not None else "–" for r in runs])
    row("batches (from the worker log)", [str(r.batches.count or "–") for r in runs])
    row("rows per batch, median / max",
        [f"{r.batches.rows_median:,.0f} / {r.batches.rows_max:,}" if r.batches.count else "–"
         for r in runs])
    row("batch read (Spark) median / merge (PostgreSQL) median",
        [f"{r.batches.read_median:.3f} s / {r.batches.merge_median:.3f} s" if r.batches.count
         else "–" for r in runs])
    row("sum of reads / sum of merges (2 slots, overlapped)",
        [f"{r.batches.read_total:.1f} s / {r.batches.merge_total:.1f} s" if r.batches.count
         else "–" for r in runs])
    row("worker peak RSS (python + JVM)", [mib(r.peak_rss) for r in runs])
    add("")
    for run in runs:
        line = (f"- `{run.job_type}` {run.label}: {run.first_commit:.1f} s of {run.total:.1f} s "
                f"({run.first_commit / run.total:.0%}) pass before the first batch commits, "
                f"{run.created:.1f} s of them in `reorg submit` before the job row exists; "
                f"the subtasks then run {run.processing:.1f} s, "
                f"{res.rows / run.processing:,.0f} rows/s, where (3) does "
                f"{res.rows / res.chunked_sql:,.0f} rows/s.")
        if run.batches.count:
            bound = "Spark" if run.batches.read_total > run.batches.merge_total else "PostgreSQL"
            line += (f" Summed over both slots, Spark reads took {run.batches.read_total:.1f} s "
                     f"and merges {run.batches.merge_total:.1f} s; they overlap, so this run "
                     f"was bound by {bound}.")
        add(line)
    add("")
    for job_type, up in res.worker_startup.items():
        first = next(r for r in runs if r.job_type == job_type and r.label == "first")
        if up.spark_ready_after is not None:
            took = ("" if up.spark_seconds is None
                    else f" (taking {up.spark_seconds:.2f} s from its JVM's launch)")
            spark = (f"; it started its SparkSession by itself{took}, "
                     f"ready {up.spark_ready_after:.2f} s after launch")
        elif first.spark_start is not None:
            spark = (f"; it started Spark only in its first job, which took "
                     f"{first.spark_start:.2f} s of that run")
        else:
            spark = ""
        add(f"- Worker start-up (`{job_type}` runs), before the clock: launch → registered in "
            f"`reorg nodes --json` {up.registered_after:.2f} s{spark}.")
    add("")
    add("## Worker memory\n")
    top = max(res.reorg_runs, key=lambda r: r.peak_rss)
    add(f"Peak resident memory of the worker's process tree: **{mib(top.peak_rss)}** "
        f"(`{top.job_type}`, {top.label} run): "
        + ", ".join(f"{k.split(':')[0]} {mib(v)}" for k, v in
                    sorted(top.peak_split.items(), key=lambda kv: -kv[1]) if v >= 2**20)
        + f". Sampled every {SAMPLE_SECONDS} s from `/proc/PID/statm` (resident pages) of the "
        "worker process and all its descendants (the JVM that PySpark launches), summed; "
        "pages shared between processes count in each.\n")


def write_kill_section(res: Results, add: Add) -> None:
    k = res.kill
    assert k is not None
    add("## Rows re-processed after kill -9\n")
    add(f"A second `{k.job_type}` run on the reset table: worker A's process tree (with its "
        f"JVM, if it had started Spark) was SIGKILLed once {k.killed_at_rows:,} rows "
        f"({k.killed_at_rows / res.rows:.0%}) were "
        f"committed, holding {len(k.in_flight)} subtask(s). Worker B, started right after, "
        f"claimed them again {k.reclaimed_after:.1f} s after the kill (their leases had to "
        f"expire) and finished the job; the whole run took {k.total:.1f} s. Every row was "
        "checked afterwards.\n")
    add("| measure | rows |\n| --- | ---: |")
    add(f"| committed: sum of `row_count` over the job's subtasks (table: {res.rows:,}) | "
        f"{k.committed_sum:,} |")
    add(f"| written more than once: `n_tup_upd` delta − rows | {k.rows_updated - res.rows:,} |")
    add("| read more than once: Spark range reads in the server log − rows | "
        + ("n/a (no reads logged: not our server, or not a Spark job type)" if k.rows_read is None
           else f"{k.rows_read - res.rows:,}") + " |")
    add(f"| subtask claims (attempts) in all | {k.attempts} |\n")
    if k.rows_read is None:
        twice = k.rows_updated - res.rows
        add(f"Re-processed (written twice): {twice:,} rows = {twice / k.batch_rows:.1f} batches of "
            f"the job's {k.batch_rows:,} rows over {len(k.in_flight)} slots.\n")
        return
    add("Per subtask worker A held (one per slot): what it had committed and the reads it had "
        "started beyond that, which worker B did again.\n")
    add("| subtask | committed to key | lost reads (key ranges) | batches | rows |")
    add("| ---: | ---: | --- | ---: | ---: |")
    for sub in k.in_flight:
        batches = sub.lost_batches()
        add(f"| {sub.subtask_id} | {sub.committed_to:,} | "
            + (", ".join(f"[{lo:,}, {hi:,})" for lo, hi in batches) or "none")
            + f" | {len(batches)} | {sub.lost_rows:,} |")
    worst = max((len(s.lost_batches()) for s in k.in_flight), default=0)
    lost = sum(s.lost_rows for s in k.in_flight)
    add("")
    most = max((s.lost_rows for s in k.in_flight), default=0)
    add(f"Re-processed in all: {lost:,} rows in "
        f"{sum(len(s.lost_batches()) for s in k.in_flight)} batches over {len(k.in_flight)} "
        f"slots, at most {worst} batches and {most:,} rows per slot; the job's `--batch-rows` "
        f"is {k.batch_rows:,}. A slot's pipeline has up to two Spark reads in flight (the one "
        "whose batches it is merging, and the next one), each of up to `batches_per_read` "
        "batches (10 for `backfill`) of at most `--batch-rows` rows (`backfill.spark.sizing`), "
        "so a kill re-reads up to that much. Writes are redone at most one batch per slot: "
        "each batch of a read merges and commits with its checkpoint alone, and only the one "
        "merging at the kill rolls back (counted in the rows written more than once above).\n")


METHOD = f"""\
In `bench/README.md`, "The data-plane benchmark"; in short:

- **Server**: without `--db`, a durable throwaway cluster (`fsync`, `synchronous_commit` and
  `full_page_writes` on, as in production: every commit waits for its WAL flush, for every
  contender alike); `--fast-server` turns the three off.
- **Same start**: the table reloaded in key order, `VACUUM (ANALYZE)` and `CHECKPOINT` before
  each contender; one disturbed by other processes (over 10 % of the CPUs) runs again.
- **(1) reorg**: launch of `reorg submit ... --wait` to its exit 0, on one warm `reorg worker
  --slots {WORKER_SLOTS}`.
- **(2) plain Spark**: JDBC read in {SPARK_PARTITIONS} partitions, `md5` in Spark, JDBC write to an UNLOGGED
  staging table, one `UPDATE ... FROM` it.
- **(3) chunked SQL**: {CHUNK_ROWS:,}-key chunks on {SQL_CONNECTIONS} autocommit connections, timed
  without a process start.
- **kill -9** at {KILL_AT:.0%} committed: rows written twice from `n_tup_upd`, rows read twice from
  the server log (`log_statement = 'all'` for that run only).
"""
