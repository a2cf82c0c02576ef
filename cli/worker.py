"""``reorg worker``: run one node (worker slots + owner candidate) until
SIGTERM or SIGINT, then drain and exit 0."""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Annotated

import typer

from cli.context import cli_state
from framework import jobtype
from framework.node import Node

app = typer.Typer()
log = logging.getLogger("reorg.cli.worker")


@app.command()
def worker(
    ctx: typer.Context,
    slots: Annotated[int, typer.Option(envvar="REORG_SLOTS", min=1,
                                       help="Subtasks this node runs at once.")] = 2,
    node_id: Annotated[str | None, typer.Option(
        envvar="REORG_NODE_ID", help="Stable node id (default host:pid); a restart with the "
        "same id releases what the previous run held.")] = None,
    poll_seconds: Annotated[float, typer.Option(
        envvar="REORG_POLL_SECONDS", min=0.05,
        help="Idle poll interval when no notification arrives.")] = 1.0,
) -> None:
    """Run a worker node until SIGTERM/SIGINT; then drain and deregister."""
    state = cli_state(ctx)
    state.database()  # schema check; the node opens its own connections
    state.close()
    configure_logging(state.options.debug)
    settings = dataclasses.replace(state.settings(), poll_seconds=poll_seconds)
    # Loading the job types now makes a broken entry point fail at start, not
    # at the first claim.
    types = jobtype.names()
    stop = _stop_on_signals()
    node = Node(settings, node_id=node_id, slots=slots)
    node.start()
    log.info("job types: %s", ", ".join(types) or "none")
    while not stop.wait(1.0):
        pass
    log.info("stop requested; draining (signal again to exit at once)")
    node.drain()


def configure_logging(debug: bool) -> None:
    logging.basicConfig(
        stream=sys.stderr, level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # APScheduler logs every run of every interval job at INFO.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        # No logging here: the handler may interrupt the main thread inside
        # the logging module's lock.
        stop.set()
        # A second signal takes the default action: stop without draining.
        signal.signal(signum, signal.SIG_DFL)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    return stop
