"""The worker's log: text (default) or one JSON object a line (``--log-format json``).

JSON lines carry ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``,
``message``, ``node`` and, where they apply, ``job_id``, ``subtask_id``,
``job_type``, ``outcome``, ``rows``, ``batches``, ``seconds``, the figures of
a progress line (``state``, ``rows_done``, ``rows_total``, ``percent``,
``rows_per_sec``, ``eta_seconds``, ``throttled``, ``backlog``), and ``exc`` (a
traceback, as one string).

In JSON mode nothing else may reach stdout or stderr as raw text, yet Spark's
JVM (a child process) writes to the file descriptors it inherits: start-up
banners, and log4j errors (``backfill/spark/session.py`` sends log4j to stderr
at level ERROR). So file descriptors 1 and 2 become one pipe, read by a thread
that logs each line it gets as a record of logger ``output`` (level ERROR for
lines that start with ``error``/``ERROR`` or a Java exception, INFO otherwise);
only the log handler writes to the real stderr. Whatever any child or library
prints, each line of the stream stays one JSON object.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from datetime import UTC, datetime
from typing import IO, Any

from framework.redact import redact

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Fields a record may carry through ``extra=``; copied into the JSON object.
FIELDS = ("job_id", "subtask_id", "job_type", "outcome", "rows", "batches", "seconds",
          # The owner's progress line of a job (framework.job_reports).
          "state", "rows_done", "rows_total", "percent", "rows_per_sec", "eta_seconds",
          "throttled", "backlog")
# APScheduler warns at every interval a job is still running ("skipped: maximum
# number of running instances reached"): expected with long owner ticks.
_SKIPPED = "maximum number of running instances reached"

_json_active = False


class JsonFormatter(logging.Formatter):
    def __init__(self, node_id: str | None = None) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.node_id:
            entry["node"] = self.node_id
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # A library quoting its connection URL must not leak its password.
        return redact(json.dumps(entry, default=str))


class TextFormatter(logging.Formatter):
    """The text format, with passwords masked like the JSON one's."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _QuietSkips(logging.Filter):
    """APScheduler's "skipped: maximum number of running instances" warning
    becomes DEBUG (shown only with --debug)."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("apscheduler") and _SKIPPED in record.getMessage():
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.debug
        return True


def configure(*, debug: bool, fmt: str = "text", node_id: str | None = None) -> None:
    """Set up the root logger for ``reorg worker``."""
    global _json_active
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    stream: IO[str] = sys.stderr
    if fmt == "json":
        stream = _wrap_raw_output()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(node_id) if fmt == "json"
                         else TextFormatter(TEXT_FORMAT))
    handler.addFilter(_QuietSkips(debug))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    # APScheduler logs every run of every interval job at INFO.
    logging.getLogger("apscheduler").setLevel(logging.DEBUG if debug else logging.WARNING)
    # py4j logs each Python thread's gateway connection closing at INFO, and a
    # reset one it then reopens as a traceback: noise, not failures.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    _json_active = fmt == "json"


def json_active() -> bool:
    """True once ``configure`` set up JSON lines: errors go through the log too."""
    return _json_active


def _wrap_raw_output() -> IO[str]:
    """Point fds 1 and 2 at a pipe whose lines are logged; return a stream on
    the real stderr for the log handler."""
    sys.stdout.flush()
    sys.stderr.flush()
    real = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8",
                     errors="backslashreplace")
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    threading.Thread(target=_log_lines, args=(read_fd,), name="raw-output",
                     daemon=True).start()
    return real


def _log_lines(read_fd: int) -> None:
    log = logging.getLogger("output")
    with os.fdopen(read_fd, "r", encoding="utf-8", errors="backslashreplace") as pipe:
        for line in pipe:
            text = line.rstrip()
            if not text:
                continue
            is_error = text.lower().startswith("error") or "Exception" in text.split(":", 1)[0]
            log.log(logging.ERROR if is_error else logging.INFO, "%s", text)
