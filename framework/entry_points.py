"""The entry points of the installed distributions, by group: how job types
and their commands join reorg (``framework.jobtype``, ``cli.plugin``).

One scan of every installed distribution, once per process, and only when a
group is asked for: importing ``importlib.metadata`` and reading every
distribution's metadata is tens of milliseconds, most of a short command's
start-up beside its imports (``reorg status`` without a job asks for none).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoints


@functools.cache
def _all_entry_points() -> Any:
    from importlib.metadata import entry_points

    # EntryPoints, or on Python 3.11 SelectableGroups: both ``select`` alike.
    return entry_points()


def installed_entry_points(group: str) -> EntryPoints:
    """The installed entry points of ``group``."""
    return _all_entry_points().select(group=group)  # type: ignore[no-any-return]
