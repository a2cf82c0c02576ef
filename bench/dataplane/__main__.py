"""``python -m bench.dataplane``: see ``bench.dataplane.command``."""

from bench.dataplane.command import run

run()
