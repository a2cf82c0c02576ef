"""reorg's installed version, in a module of its own: ``reorg --version``
reads it without importing the node and what the node imports."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def reorg_version() -> str:
    try:
        return version("reorg")
    except PackageNotFoundError:
        return "dev"
