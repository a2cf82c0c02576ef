"""``reorg worker``: run one node (worker slots + owner candidate) until
SIGTERM or SIGINT, then drain and exit 0."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
import signal
import threading
from types import FrameType
from typing import Annotated, Any

import typer

from cli import logs, plugin
from cli.context import cli_state
from framework import gc_tuning, jobtype

app = typer.Typer()


class LogFormat(enum.StrEnum):
    text = "text"
    json = "json"

log = logging.getLogger("reorg.cli.worker")


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
    metrics_port: Annotated[int | None, typer.Option(
        envvar="REORG_METRICS_PORT", min=1, max=65535, show_default=False,
        help="Serve Prometheus metrics at http://HOST:PORT/metrics and the node's health "
             "at /healthz.")] = None,
    metrics_host: Annotated[str, typer.Option(
        envvar="REORG_METRICS_HOST",
        help="Address --metrics-port listens on: 0.0.0.0 (every interface), 127.0.0.1 "
             "(this host only), or one interface's address.")] = "0.0.0.0",
    progress_seconds: Annotated[float, typer.Option(
        envvar="REORG_PROGRESS_SECONDS", min=0,
        help="While this node is the owner: log each running job's progress line (rows, "
             "rate, ETA, throttle) this often; 0: never.")] = 30.0,
    log_format: Annotated[LogFormat, typer.Option(
        envvar="REORG_LOG_FORMAT", case_sensitive=False,
        help="text, or json: one JSON object a line on stderr, Spark's output included.")
    ] = LogFormat.text,
    **contributed: Any,
) -> None:
    """Run a worker node until SIGTERM/SIGINT; then drain and deregister."""
    state = cli_state(ctx)
    # The node (APScheduler, the listener) loads only for this command, not
    # for every `reorg` command that imports this module.
    from framework.node import Node, default_node_id
    from framework.status_server import StatusServer

    node_id = node_id or default_node_id()
    # First, so that even a failure to start is logged in the chosen format.
    logs.configure(debug=state.options.debug, fmt=log_format.value, node_id=node_id)
    state.database()  # schema check; the node opens its own connections
    state.close()
    settings = dataclasses.replace(state.settings(), poll_seconds=poll_seconds)
    status = None
    if metrics_port is not None:
        try:
            status = StatusServer(metrics_host, metrics_port)
        except (OSError, UnicodeError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise typer.BadParameter(f"cannot listen on {metrics_host}:{metrics_port}: {why}; "
                                     "pick another --metrics-host / --metrics-port",
                                     param_hint="--metrics-port") from None
        status.start()
        log.info("metrics at http://%s:%d/metrics, health at /healthz", metrics_host,
                 metrics_port)
    # The job types' own options (cli.plugin), applied before the node starts.
    after_start = [start for start in plugin.apply_worker_options(contributed) if start]
    # Loading the job types now makes a broken entry point fail at start, not
    # at the first claim.
    types = jobtype.names()
    stop = _stop_on_signals()
    node = Node(settings, node_id=node_id, slots=slots, progress_seconds=progress_seconds)
    node.start()
    if status is not None:
        status.health = node.health
    gc_tuning.settle_after_start()
    log.info("job types: %s", ", ".join(types) or "none")
    for start in after_start:
        threading.Thread(target=start, args=(settings.database_url,), name="worker-start",
                         daemon=True).start()
    while not stop.wait(1.0):
        pass
    log.info("stop requested; draining (signal again to exit at once)")
    node.drain()


# typer reads the signature: the worker's own options, then the job types'.
worker.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    *(p for p in inspect.signature(worker, eval_str=True).parameters.values()
      if p.kind is not inspect.Parameter.VAR_KEYWORD),
    *plugin.worker_option_parameters()])
worker.__annotations__ = {}  # else typer would also resolve ``**contributed``
app.command()(worker)


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
