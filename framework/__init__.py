"""reorg's generic task framework.

Owns the system tables (through ``framework.store``), the elected owner
(``framework.owner``), the worker pool and its leases (``framework.worker``),
and the job-type extension point (``framework.jobtype``).

Must never import ``backfill`` or ``cli``: job types register themselves from
outside, through the ``reorg.job_types`` entry point or ``jobtype.register``.
"""
