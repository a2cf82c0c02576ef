"""Alembic environment: runs migrations online against the URL and schema that
``framework.migrate`` passes in ``config.attributes`` (there is no alembic.ini;
reorg drives alembic programmatically so the schema name is configurable)."""

from alembic import context
from sqlalchemy import text

config = context.config
connection = config.attributes["connection"]
schema = config.attributes["schema"]

# The version table lives in reorg's own schema so several reorg installations
# (different schemas) can share one database.
connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
context.configure(
    connection=connection,
    version_table_schema=schema,
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
