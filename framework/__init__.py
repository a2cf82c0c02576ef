"""reorg's generic task framework.

Owns the system tables (through ``framework.store``), the elected owner
(``framework.owner``), the worker pool and its leases (``framework.worker``),
and the job-type extension point (``framework.jobtype``).

``framework.localpg`` (a local PostgreSQL run from the machine's binaries,
and the embedded default database) sits here only to be shared by ``cli``,
tests and benchmarks; the framework's own modules never import it.

Must never import ``backfill`` or ``cli``: job types register themselves from
outside, through the ``reorg.job_types`` entry point or ``jobtype.register``.
Nor typer or the dashboard's web libraries (Starlette, uvicorn, Jinja2): every
interface to people lives in ``cli``.
"""
