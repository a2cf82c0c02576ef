"""A number of seconds as people read it: the owner's progress log line
(``job_reports``) and the command line's tables (``cli.output``) say it alike."""

from __future__ import annotations

from decimal import Decimal


def duration(seconds: float | Decimal | None) -> str:
    """43s, 12m05s, 2h03m; ``-`` when not known."""
    if seconds is None:
        return "-"
    s = int(round(float(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
