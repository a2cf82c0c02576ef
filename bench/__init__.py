"""Benchmarks of reorg, run by hand (``bench/README.md``), never imported by
``framework``, ``backfill``, ``cli`` or ``migrations``.

They read reorg's system tables only through ``framework.control`` and
``framework.store`` functions; figures go to ``docs/benchmarks.md``.
"""
