"""Fixtures for tests of the framework on a real PostgreSQL (a pytest plugin,
named in tests/conftest.py): a migrated database per test (copied from a
template migrated once per session), settings with short leases, in-process
nodes that are always drained, ``reorg worker`` processes that are always
killed, and fault points disarmed around every test."""

from __future__ import annotations

import signal
import tempfile
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from framework import faults, migrate
from framework.config import Settings
from framework.db import Database
from framework.node import Node
from support.db import create_database, database_url, drop_database
from support.fill import register as register_test_fill
from support.processes import Workers

TEMPLATE = "reorg_template"


@pytest.fixture(autouse=True)
def _faults_disarmed() -> Iterator[None]:
    """No test sees another's fault points, signals or blocked threads."""
    faults.disarm_all()
    faults.disable_signals()
    yield
    faults.disarm_all()
    faults.disable_signals()


def pytest_configure(config: pytest.Config) -> None:
    # A test process started in the background by a non-interactive shell
    # (`bash .ci/run &`) inherits SIGINT ignored, and would hand that on to
    # every process its tests start (they would then sleep through a Ctrl-C).
    # Started from a terminal it has the default: the tests get that alike.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _sigint_state() -> tuple[bool, bool]:
    """Whether SIGINT is ignored, and whether it is blocked, in this thread."""
    return (signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
            signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.fixture(autouse=True)
def _sigint_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves SIGINT ignored or blocked in the test process hands
    that on to every process a later test starts (they then sleep through a
    Ctrl-C): put it back, and name the test in a warning."""
    main = threading.current_thread() is threading.main_thread()
    before = _sigint_state() if main else (False, False)
    yield
    if not main:
        return
    (was_ignored, was_blocked), (is_ignored, is_blocked) = before, _sigint_state()
    ignored, blocked = is_ignored and not was_ignored, is_blocked and not was_blocked
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if ignored or blocked:
        warnings.warn(f"{request.node.nodeid} left SIGINT "
                      f"{'ignored' if ignored else 'blocked'}; put back", stacklevel=1)


@pytest.fixture(autouse=True, scope="session")
def _test_fill_registered() -> None:
    register_test_fill()


@pytest.fixture(scope="session")
def migrated_template(pg_server: str) -> str:
    drop_database(pg_server, TEMPLATE)
    url = create_database(pg_server, TEMPLATE)
    db = Database(Settings(url))
    migrate.upgrade(db)
    db.dispose()
    return TEMPLATE


@pytest.fixture
def migrated_db(pg_server: str, migrated_template: str) -> Iterator[str]:
    """URL of a new database with reorg's system tables installed."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    create_database(pg_server, name, template=migrated_template)
    try:
        yield database_url(pg_server, name)
    finally:
        drop_database(pg_server, name)


@pytest.fixture
def settings(migrated_db: str) -> Settings:
    """Short leases so takeovers happen within a test's patience."""
    return Settings(migrated_db, lease_seconds=3, owner_lease_seconds=3, poll_seconds=0.2,
                    heartbeat_seconds=0.5, retry_backoff_seconds=0.2, local_job_max_subtasks=0)


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.dispose()


@pytest.fixture
def start_node(settings: Settings) -> Iterator[Callable[..., Node]]:
    """Start in-process nodes; every one is drained at teardown."""
    started: list[Node] = []

    def start(node_id: str | None = None, slots: int = 2, progress_seconds: float = 30.0,
              **overrides) -> Node:
        s = Settings(**{**settings.__dict__, **overrides}) if overrides else settings
        node = Node(s, node_id=node_id or f"node-{len(started)}", slots=slots,
                    owner_tick_seconds=0.2, progress_seconds=progress_seconds)
        node.start()
        started.append(node)
        return node

    yield start
    faults.disarm_all()  # a slot blocked at a fault point would hold its drain up
    for node in started:
        if not node.stopped.is_set():
            node.drain(timeout=10)


@pytest.fixture
def gates() -> Iterator[faults.Gates]:
    """``block`` fault points of the worker processes this test starts."""
    with tempfile.TemporaryDirectory(prefix="reorg-gates-") as directory:
        yield faults.Gates(Path(directory))


@pytest.fixture
def workers(migrated_db: str, gates: faults.Gates) -> Iterator[Workers]:
    """``reorg worker`` processes on ``migrated_db``; killed at teardown."""
    pool = Workers(migrated_db, gates)
    yield pool
    pool.stop_all()
