"""``alter-type``'s two methods, and a whole-table overwrite by
``sql-update`` and by ``rewrite --set``, on the same table in the same run
(issue 24: choose ``alter-type``'s default method by a benchmark; measure a
``rewrite --set`` of an existing column against ``sql-update`` on the same
change)::

    python -m bench.methods --scale 10 --rounds 3
    python -m bench.methods --scale 2 --forms set

On ``bench.rewrite``'s bloated ``pgbench_accounts`` (a third of its rows
updated, one secondary index), a TPC-B application running throughout but
during the floors, on a durable throwaway server (``--db`` for another):

- alter: ``ALTER TABLE pgbench_accounts ALTER COLUMN aid TYPE bigint``
  (offline: the floor), ``reorg submit alter-type --column aid --type
  bigint`` (``--method column``, the default: a shadow column, a backfill
  UPDATE of every row, a cut-over) and the same with ``--method rewrite``
  (a ``rewrite`` job: the table copied with the change, then swapped);
- set: ``UPDATE pgbench_accounts SET filler = md5(aid::text)`` (one
  statement, no application: the floor), ``reorg submit sql-update --set
  "filler = md5(aid::text)"`` (batch by batch in place, each old value kept
  for a cancel) and ``reorg submit rewrite --set "filler=md5(aid::text)"``
  (a copy computing the column; the old table is the way back), and the
  same with ``--engine spark`` (Spark computes the column of each batch:
  the price of the Spark data plane against SQL on the same change).

reorg runs on one in-process node of 2 slots, default knobs. Contenders
take turns round after round; medians printed, with each one's ratio to
its form's floor, the application's longest statement and TPS against its
baseline, WAL bytes and the table's size after. Printed, not written
(figures in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from bench import rewrite as rewrite_bench
from bench.dataplane.server import database
from bench.rewrite import ALTER, Contender, Result, median, offline, run

SET = "filler = md5(aid::text)"
SPARK_SET = "md5(CAST(aid AS string))"  # the same value, computed by Spark
FORMS = ("alter", "set")


def reorg_job(job_type: str, **params: Any) -> Contender:
    return rewrite_bench.reorg_job(job_type, None, **params)


def contenders(forms: list[str]) -> list[tuple[str, Contender, bool]]:
    """(name, run, with the application) of each contender of ``forms``;
    each form's floor first."""
    chosen: list[tuple[str, Contender, bool]] = []
    if "alter" in forms:
        chosen += [
            (f"ALTER TABLE ... {ALTER} (offline)",
             offline(f"ALTER TABLE pgbench_accounts {ALTER}"), False),
            ("reorg alter-type --method column",
             reorg_job("alter-type", column="aid", type="bigint"), True),
            ("reorg alter-type --method rewrite",
             reorg_job("alter-type", column="aid", type="bigint", method="rewrite"), True)]
    if "set" in forms:
        chosen += [
            (f"UPDATE ... SET {SET} (one statement)",
             offline(f"UPDATE pgbench_accounts SET {SET}"), False),
            (f"reorg sql-update --set \"{SET}\"", reorg_job("sql-update", set=SET), True),
            (f"reorg rewrite --set \"{SET.replace(' = ', '=')}\"",
             reorg_job("rewrite", sets=[SET.replace(" = ", "=")]), True),
            (f"reorg rewrite --engine spark --set \"filler={SPARK_SET}\"",
             reorg_job("rewrite", sets=[f"filler={SPARK_SET}"], engine="spark"), True)]
    return chosen


def report(scale: int, rounds: int, forms: list[str],
           results: dict[str, list[Result]]) -> None:
    med = {name: median(rs) for name, rs in results.items()}
    of = f"median of {rounds} rounds" if rounds > 1 else "one round"
    print(f"\n| pgbench_accounts, scale {scale} ({scale * 100_000:,} rows), {of} | wall time "
          "| vs the floor | longest app statement | TPS (baseline) | WAL | size after |\n"
          "| --- | ---: | ---: | ---: | --- | ---: | ---: |")
    floor: Result | None = None
    for name, r in med.items():
        if "(offline)" in name or "(one statement)" in name:
            floor = r
        app = (f"{r.longest_statement * 1000:.0f} ms | {r.tps:.0f} ({r.baseline_tps:.0f})"
               if r.longest_statement is not None and r.tps is not None
               and r.baseline_tps is not None else "– | –")
        ratio = f"{r.seconds / floor.seconds:.2f}x" if floor else "–"
        print(f"| {name} | {r.seconds:.2f} s | {ratio} | {app} | {r.wal_bytes / 2**20:.0f} MiB "
              f"| {r.size_after / 2**20:.0f} MiB |")
    def named(prefix: str) -> str | None:
        return next((n for n in med if n.startswith(prefix)), None)

    pairs = [("reorg alter-type --method column", "reorg alter-type --method rewrite"),
             (named("reorg sql-update"), named("reorg rewrite --set")),
             (named("reorg rewrite --set"), named("reorg rewrite --engine spark"))]
    for first, second in pairs:
        if first in med and second in med:
            print(f"\n{second}: {med[second].seconds / med[first].seconds:.2f}x the time of "
                  f"{first}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10, help="pgbench scale (100,000 rows each)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every contender, round after round; medians printed")
    parser.add_argument("--forms", default=",".join(FORMS),
                        help=f"comma-separated, of: {', '.join(FORMS)}")
    parser.add_argument("--db", help="postgresql:// URL; default: a durable throwaway server "
                                     "under /tmp")
    args = parser.parse_args()
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not forms or any(f not in FORMS for f in forms):
        parser.error(f"--forms {args.forms}: give some of {', '.join(FORMS)}")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    with database(args.db, durable=True) as server:
        results = run(server.url, args.scale, contenders(forms), max(args.rounds, 1))
    report(args.scale, max(args.rounds, 1), forms, results)


if __name__ == "__main__":
    main()
