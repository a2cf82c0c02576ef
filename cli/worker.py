"""``reorg worker``: run one node (worker slots + owner candidate) until
SIGTERM or SIGINT, then drain and exit 0."""

from __future__ import annotations

import dataclasses
import enum
import logging
import signal
import threading
from types import FrameType
from typing import Annotated

import typer

from cli import logs
from cli.context import cli_state
from framework import jobtype, metrics
from framework.errors import one_line

app = typer.Typer()


class LogFormat(enum.StrEnum):
    text = "text"
    json = "json"

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
    spark_master: Annotated[str | None, typer.Option(
        envvar="REORG_SPARK_MASTER",
        help="Spark master for Spark job types: local[*] (default), spark://host:7077, k8s://...")
    ] = None,
    spark_conf: Annotated[list[str] | None, typer.Option(
        help="Spark setting KEY=VALUE passed through; repeatable. "
             "Env REORG_SPARK_CONF takes 'k=v;k=v'.")] = None,
    spark_warmup: Annotated[bool, typer.Option(
        envvar="REORG_SPARK_WARMUP",
        help="Start Spark when the worker starts (takes seconds; ~0.5 GiB more memory) "
             "instead of when a job type that needs it first runs here.")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        envvar="REORG_METRICS_PORT", min=1, max=65535, show_default=False,
        help="Serve Prometheus metrics at http://0.0.0.0:PORT/metrics.")] = None,
    log_format: Annotated[LogFormat, typer.Option(
        envvar="REORG_LOG_FORMAT", case_sensitive=False,
        help="text, or json: one JSON object a line on stderr, Spark's output included.")
    ] = LogFormat.text,
) -> None:
    """Run a worker node until SIGTERM/SIGINT; then drain and deregister."""
    state = cli_state(ctx)
    # The node (APScheduler, the listener) loads only for this command, not
    # for every `reorg` command that imports this module.
    from framework.node import Node, default_node_id

    node_id = node_id or default_node_id()
    # First, so that even a failure to start is logged in the chosen format.
    logs.configure(debug=state.options.debug, fmt=log_format.value, node_id=node_id)
    state.database()  # schema check; the node opens its own connections
    state.close()
    settings = dataclasses.replace(state.settings(), poll_seconds=poll_seconds)
    if metrics_port is not None:
        try:
            metrics.serve(metrics_port)
        except OSError as exc:
            raise typer.BadParameter(f"cannot listen on port {metrics_port}: {exc.strerror}",
                                     param_hint="--metrics-port") from None
        log.info("metrics at http://0.0.0.0:%d/metrics", metrics_port)
    configure_spark(spark_master, spark_conf or [])
    # Loading the job types now makes a broken entry point fail at start, not
    # at the first claim.
    types = jobtype.names()
    stop = _stop_on_signals()
    node = Node(settings, node_id=node_id, slots=slots)
    node.start()
    log.info("job types: %s", ", ".join(types) or "none")
    if spark_warmup:
        threading.Thread(target=_warm_up, args=(types,), name="warm-up", daemon=True).start()
    while not stop.wait(1.0):
        pass
    log.info("stop requested; draining (signal again to exit at once)")
    node.drain()


def configure_spark(master: str | None, conf_pairs: list[str]) -> None:
    """Spark settings from options over the environment; applied before the
    process's one SparkSession starts (it is created once and reused)."""
    from backfill.spark import session

    from_env = session.settings_from_env()
    try:
        extra = session.parse_conf_pairs(conf_pairs)
    except session.SparkUnavailable as exc:
        raise typer.BadParameter(str(exc), param_hint="--spark-conf") from None
    session.configure(dataclasses.replace(
        from_env, master=master or from_env.master, conf={**from_env.conf, **extra}))


def _warm_up(types: list[str]) -> None:
    # Start what the job types need (Spark: seconds) while the node is idle,
    # not inside the first subtask's lease. A failure here is only logged:
    # subtasks that need it will fail with the same one-line reason.
    for name in types:
        try:
            jobtype.warm_up(jobtype.get(name), None)
        except Exception as exc:
            log.warning("%s did not warm up: %s", name, one_line(exc))


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
