"""Local PostgreSQL servers run from the machine's own binaries (no Docker):
``cluster`` initialises, starts and stops one (``LocalPostgres``);
``embedded`` keeps the default database ``reorg`` uses when none is
configured.

Not part of the task framework: nothing in ``framework`` outside this
package imports it; ``cli`` does (its errors, and the embedded default
started lazily by ``cli.context``), as do the tests and benchmarks.
Never imports the rest of ``framework``, ``backfill`` or ``cli``.
"""
