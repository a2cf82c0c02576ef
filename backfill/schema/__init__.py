"""Helpers of online schema-change job types (shadow columns, triggers, the
catalogue facts a cut-over keeps): read what the catalogue says about a
column, rewrite an index or constraint definition onto another column, and
install or remove the trigger that keeps a shadow column in step with every
application write.

Shared by schema-change job types (``alter-type``); imports nothing of any
job type and nothing of Spark.
"""
