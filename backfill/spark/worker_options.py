"""``reorg worker`` options of the Spark job types (``backfill``, ``copy``,
``checksum``), contributed through the ``reorg.worker_options`` entry point
(``cli.plugin``): cli/ knows no Spark."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Annotated

import typer

from framework import jobtype
from framework.errors import one_line

log = logging.getLogger("reorg.cli.worker")


def spark(
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
) -> Callable[[str], None] | None:
    """Configure the process's Spark before the node starts; with
    ``--spark-warmup``, return the warm-up the worker runs once the node runs."""
    configure_spark(spark_master, spark_conf or [])
    return warm_up_job_types if spark_warmup else None


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


def warm_up_job_types(database_url: str) -> None:
    """Start what the job types need (Spark: seconds) while the node is idle,
    not inside the first subtask's lease, then run a made-up analysis so the
    first submit's does not pay the JVM's first run of those paths (measured
    under load: 8.7 s cold, 2.9 s warmed without a JDBC read, 1.0 s with one;
    0.3-0.7 s after). A failure here is only logged: subtasks that need it
    fail with the same one-line reason."""
    from backfill.spark import session, warmup

    for name in jobtype.names():
        try:
            jobtype.get(name).warm_up(None)
        except Exception as exc:
            log.warning("%s did not warm up: %s", name, one_line(exc))
    if session.started():
        started = time.monotonic()
        try:
            warmup.warm_analysis(database_url)
        except Exception as exc:  # only a speed-up
            log.warning("Spark's analysis paths did not warm up: %s", one_line(exc))
        else:
            log.info("Spark warmed up for a first analysis in %.1fs", time.monotonic() - started)
