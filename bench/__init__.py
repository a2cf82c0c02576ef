"""Benchmarks of reorg, run by hand (``bench/README.md``), never imported by
``framework``, ``backfill``, ``cli`` or ``migrations``.

They drive reorg as a user does (its commands, ``framework.control``), and
read its system tables through ``framework.store`` where a function says
what they need; ``soak``, a measurement of the system tables' own
behaviour, queries them directly. Figures go to
``docs/benchmarks.md``.
"""
