"""The one error of the data-plane benchmark."""


class BenchError(RuntimeError):
    """A contender failed or produced a wrong table; the run stops."""
