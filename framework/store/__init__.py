"""All SQL of the framework, split by concern: the owner lease, jobs, a job
step's subtasks (the owner's side, ``steps``), one subtask under a lease (the
worker's side, ``subtasks``), history, progress and nodes.

Every state change is one compare-and-set statement that returns whether it
applied. Owner writes carry an ``OwnerTerm`` and are fenced on it in the same
statement (``FENCE``); worker writes are fenced on ``(id, exec_id, epoch)``.
All times come from the database clock.
"""
