"""Small runs of the benchmarks so they cannot rot. The data-plane one
(``python -m bench.dataplane``): every contender, the worker's two jobs, the figures read back
through reorg's own status functions, and the report with its hand-kept tail.

``sql-update`` keeps it short (its submit starts no Spark); the Spark side of
reorg's figures is covered by tests/unit/test_bench_figures.py. The kill -9
run is left out: it waits for a lease of the default 30 s to expire.

Whole-benchmark runs are marked ``matrix``; CI keeps the short forms: keys,
images_index, cancel_scale and the batch profile.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEPT = ("<!-- Below: kept by hand; `python -m bench.dataplane` rewrites only what is above. -->\n"
        "## Measured apart\n\nfigures that must survive a run\n")


@pytest.mark.slow
@pytest.mark.matrix  # ~36 s of a whole benchmark; see the module docstring for the short forms
@pytest.mark.spark
def test_dataplane_benchmark_runs_end_to_end_on_a_small_table(fresh_db, tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nan older run's figures\n\n" + KEPT)
    # REORG_SPARK_CDS as in every test: the session's Spark archive, never one
    # in $HOME (support.spark_archive). The worker logs go to tmp_path.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.dataplane", "--db", fresh_db, "--rows", "3000",
         "--job-type", "sql-update", "--no-kill", "--quiet-wait", "0", "--retries", "0",
         "--doc", str(doc)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = doc.read_text()
    assert "an older run's figures" not in report
    assert report.endswith(KEPT)
    for line in ("| (1) reorg `sql-update`, the worker's first job",
                 "| (1) reorg `sql-update`, the worker's second job",
                 "| (2) plain PySpark, incl. SparkSession start",
                 "| (3) SQL, 10,000-key chunks, 2 connections",
                 "| (4) one `UPDATE bench.items SET c = md5(b)`",
                 "| subtasks |",
                 "Floor of an add-column: (3) plus the start of a Python process",
                 "launch → registered in `reorg nodes --json`"):
        assert line in report
    assert "python -m bench.dataplane --db URL --rows 3000" in report  # no credentials


def test_sql_batch_profile_counts_the_batches_of_every_job(fresh_db, tmp_path):
    """``python -m bench.dataplane.batch_profile`` on a small table: the
    overwrite's batches (update with its images), the overwrite of a column
    all NULL (the guarded bare UPDATE) and the add-column's (the bare UPDATE)
    are each counted."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.dataplane.batch_profile", "--db", fresh_db,
         "--rows", "4000", "--batch-rows", "1000"],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.count(": 4 batches, job") == 3, out
    overwrite, rest = out.split("overwrite of c all NULL", 1)
    all_null, added = rest.split("--add-column", 1)
    assert "update + before-images" in overwrite and "\n  update " in added, out
    assert "update, guarded" in all_null and "before-images" not in all_null, out


@pytest.mark.spark
@pytest.mark.matrix  # a profile, not a benchmark's ratio: its own JVMs
def test_spark_batch_profile_runs_and_names_every_stage(fresh_db, tmp_path):
    """``python -m bench.dataplane.spark_batch_profile`` on a small table, one
    and two batches a read: each job's batches, the Spark job, the merge and
    the checkpoint are timed, and the probes ran."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.dataplane.spark_batch_profile", "--db", fresh_db,
         "--rows", "4000", "--batch-rows", "1000", "--batches-per-read", "1", "2",
         "--repeat", "1"],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "1 batch(es) per Spark read:" in out and "2 batch(es) per Spark read:" in out
    assert out.count("4 batches, job") == 2, out
    for stage in ("read: Spark job (JDBC read, md5, Arrow to driver)",
                  "merge (UPDATE ... FROM staging)", "checkpoint", "commit",
                  "COPY into the staging table", "CPU seconds during the job",
                  "Spark job on an empty range", "PostgreSQL serving the same read"):
        assert stage in out, stage


@pytest.mark.slow
@pytest.mark.matrix  # ~9 s of a whole benchmark; see the module docstring for the short forms
def test_framework_scale_benchmark_runs_end_to_end(fresh_db):
    """``python -m bench.framework_scale`` on 1,000 no-op subtasks, 2 processes
    x 2 slots: every figure it reports is there and plausible."""
    import json

    done = subprocess.run(
        [sys.executable, "-m", "bench.framework_scale", "--url", fresh_db, "--subtasks", "1000",
         "--processes", "2", "--slots", "2", "--pickups", "2",
         # The floor's code path runs; its length (10 s by default) is not checked.
         "--pgbench-seconds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["subtasks"] == 1000 and report["subtasks_per_second"] > 0
    for figure in ("status_ms_in_process", "status_ms_command", "status_floor_ms_command",
                   "owner_tick_ms_start", "owner_tick_ms_running", "pickup_ms"):
        assert report[figure]["n"] > 0 and report[figure]["p50"] > 0, figure
    assert report["history_moved_seconds_after_end"] >= 0


# ~30 s; in the matrix: what it guards in CI is test_command_imports.py.
@pytest.mark.matrix
def test_command_latency_benchmark_times_and_profiles_every_read_command(fresh_db):
    """``python -m bench.command_latency`` with one round of each phase, the
    load a job of 400 subtasks, three of the commands: each timed beside the
    floor, idle and under load, and its imports reported."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.command_latency", "--db", fresh_db, "--rounds", "1",
         "--import-runs", "1", "--load-rows", "4000", "--load-subtasks", "400",
         "--only", "status JOB", "--only", "checksum"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.count("| `reorg status JOB` |") == 3  # imports, idle, under load
    assert out.count("| `reorg checksum-report JOB` |") == 3
    assert "| `reorg nodes` |" not in out  # not asked for
    assert "| `floor: connect + SELECT 1` |" in out and "Under load:" in out
    imports = out.split("Idle (")[0]
    status_line = next(line for line in imports.splitlines()
                       if line.startswith("| `reorg status JOB` |"))
    assert "sqlalchemy" not in status_line and "rich" not in status_line


@pytest.mark.slow
@pytest.mark.matrix  # ~9 s of a whole benchmark; see the module docstring for the short forms
def test_wal_volume_benchmark_counts_every_contender(fresh_db):
    """``python -m bench.wal_volume`` on 20,000 rows: each contender wrote
    WAL, reorg's jobs ran their subtasks (the redo rate needs a throwaway
    server: not with --db)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.wal_volume", "--db", fresh_db, "--rows", "20000",
         "--rows-per-subtask", "5000"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import json

    # The document between chunked SQL's lap lines and the markdown table.
    report = json.loads(done.stdout[done.stdout.index("{\n"):done.stdout.index("\n| contender")])
    for label, r in report["contenders"].items():
        assert r["bytes"] > 0, label
        assert r["subtasks"] in (None, 4), label


@pytest.mark.slow
@pytest.mark.matrix  # ~18 s of a whole benchmark; see the module docstring for the short forms
def test_bigtable_benchmark_runs_end_to_end_and_keeps_the_rest_of_the_doc(fresh_db, tmp_path):
    """``python -m bench.bigtable`` on a small table (a job of ~10 s here) with
    1-second windows: the job starts, is cancelled and leaves no row changed
    (the benchmark itself fails otherwise), and its section lands below the
    hand-kept marker, replacing an earlier one and keeping what else is there."""
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nabove the marker\n\n" + KEPT
                   + "\n## 100M rows\n\nan older run\n\n## Another section\n\nkept\n")
    done = subprocess.run(
        [sys.executable, "-m", "bench.bigtable", "--db", fresh_db, "--rows", "1000000",
         "--window", "1", "--doc", str(doc)],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = doc.read_text()
    assert report.startswith("# Benchmarks\n\nabove the marker\n\n" + KEPT)
    assert "an older run" not in report and "## Another section\n\nkept\n" in report
    assert report.count("## 100M rows") == 1
    for line in ("| `reorg submit sql-update --set c=md5(b)` → job `running` |",
                 "| rows per range, ", "| 2-connection 10k-key chunked SQL, 1 s window |",
                 "0 left changed |"):
        assert line in report


@pytest.mark.slow
@pytest.mark.matrix  # a worker and three rounds of a whole benchmark, ~20 s
def test_rewrite_copy_benchmark_runs_submits_copies_cancels_and_leaves_nothing(fresh_db,
                                                                               tmp_path):
    """``python -m bench.bigtable.rewrite_copy`` on 3,000,000 rows with 1-second
    windows: each round's job runs, copies, is cancelled with nothing of it
    left behind (the benchmark fails otherwise), and the floor copies as
    many rows."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bigtable.rewrite_copy", "--db", fresh_db, "--rows",
         "3000000", "--window", "1", "--rounds", "3"],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("nothing left behind") == 3, done.stdout
    assert done.stdout.count("    copy / floor ") == 3, done.stdout
    assert "copy / floor per round: " in done.stdout and "median " in done.stdout


@pytest.mark.matrix  # a few seconds, but a benchmark's figures, not a behaviour
def test_split_benchmark_times_every_way_of_cutting_a_key_space(fresh_db):
    """``python -m bench.split`` on 20,000 rows: each way of cutting is timed
    and gives ranges; the samples' evenness is counted."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.split", "--db", fresh_db, "--rows", "20000",
         "--repeats", "2"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for way in ("dense bigint: equal widths", "dense bigint: block sample",
                "sparse bigint: block sample", "sparse bigint: exact, index walk",
                "sparse bigint: exact, window function", "text key: keyset block sample",
                "text key: exact, keyset index walk"):
        assert f"| {way}" in done.stdout, done.stdout
    assert done.stdout.count("x the median)") == 2, done.stdout


@pytest.mark.slow
@pytest.mark.matrix  # Spark jobs and two JVM starts: about two minutes
@pytest.mark.spark
def test_apart_benchmark_times_each_default_against_its_alternative(fresh_db):
    """``python -m bench.apart`` on 20,000 rows, one round: every contender
    runs to success and is in the table."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.apart", "--db", fresh_db, "--rows", "20000",
         "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for label in ("copy job, 2 slots", "INSERT INTO ... SELECT *",
                  "checksum in postgres, 1 subtask(s) at once",
                  "checksum in spark, 2 subtask(s) at once", "backfill, 50,000-row subtasks",
                  "backfill, 250,000-row subtasks", "Spark start, worker, with the archive",
                  "Spark first job, worker, without", "Spark JVM CPU, command, with the archive"):
        assert f"| {label} |" in done.stdout, done.stdout


@pytest.mark.slow
def test_images_index_benchmark_runs_on_a_small_table(fresh_db):
    """``python -m bench.images_index`` on 20,000 rows: the figures that back
    the choice in backfill/before_images.py are there."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.images_index", "--db", fresh_db, "--rows", "20000",
         "--batch-rows", "5000"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 batches of 5,000 rows on each table (20,000 images)" in done.stdout
    for line in ("indexed / not indexed: total ", "building the indexes afterwards over all "
                 "20,000 images: "):
        assert line in done.stdout


@pytest.mark.slow
def test_keys_benchmark_runs_on_a_small_table(fresh_db):
    """``python -m bench.keys`` on 3,000 rows: every key kind, both contenders,
    reorg's result checked by the bench itself."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.keys", "--db", fresh_db, "--rows", "3000",
         "--batch-rows", "500"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for kind in ("bigint", "uuid", "text+int"):
        assert f"{kind} {{'reorg_seconds': " in done.stdout


@pytest.mark.slow
def test_cancel_scale_benchmark_restores_the_table(fresh_db, tmp_path):
    """``python -m bench.cancel_scale`` on 4,000 one-row subtasks, cancelled
    at 10 %: the job is cancelled, the ranges it wrote are restored in fewer
    revert ranges than there were forward ranges, and the table is exactly
    as before (the benchmark exits 1 otherwise)."""
    import json

    done = subprocess.run(
        [sys.executable, "-m", "bench.cancel_scale", "--db", fresh_db, "--rows", "4000",
         "--subtasks", "4000", "--cancel-at", "10"],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)},  # the worker logs
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report, end = json.JSONDecoder().raw_decode(done.stdout)
    assert done.stdout[end:].strip().endswith("restored exactly: yes"), done.stdout
    assert report["subtasks"] == 4000 and report["done_at_cancel"] >= 400
    assert report["rows_to_restore"] >= report["done_at_cancel"], report
    assert 1 <= report["revert_ranges"] < report["forward_ranges_to_restore"], report
    assert report["restored_exactly"] and report["rows_differing"] == 0
    assert (0 < report["seconds_cancel_to_revert_step"]
            <= report["seconds_cancel_to_cancelled"]), report


# ~1 min (six contenders, each on a fresh pgbench table): in the matrix.
@pytest.mark.matrix
def test_methods_benchmark_runs_every_contender(fresh_db):
    """``python -m bench.methods`` at pgbench scale 1: every contender's row,
    the two comparisons, on the test's database."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.methods", "--scale", "1", "--db", fresh_db],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("| ALTER TABLE", "| reorg alter-type --method column |",
                 "| reorg alter-type --method rewrite |", "| UPDATE ... SET",
                 "| reorg sql-update --set", "| reorg rewrite --set",
                 "| reorg rewrite --engine spark --set"):
        assert name in done.stdout, (name, done.stdout[-3000:])
    assert "the time of reorg alter-type --method column" in done.stdout
    assert "the time of reorg sql-update" in done.stdout
    assert "the time of reorg rewrite --set" in done.stdout  # the Spark engine's against SQL's
