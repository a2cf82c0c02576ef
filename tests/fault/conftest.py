from collections.abc import Iterator

import pytest
from processes import Workers


@pytest.fixture
def workers(migrated_db: str) -> Iterator[Workers]:
    pool = Workers(migrated_db)
    yield pool
    pool.stop_all()
