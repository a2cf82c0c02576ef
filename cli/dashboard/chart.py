"""The rows/s chart of a job's page, drawn on the server as inline SVG
(``templates/rate_chart.html``): one bar per time bucket of
``framework.store.throughput``, a scale of round numbers, and the job's
rows/s limit as a dashed line when it is on the scale. No script, nothing
fetched."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cli.output import rate
from framework.durations import duration
from framework.store.throughput import Throughput

# The drawing's own units (the SVG's viewBox); the page scales it to its width.
WIDTH, HEIGHT = 960.0, 220.0
LEFT, RIGHT, TOP, BOTTOM = 70.0, 10.0, 10.0, 28.0
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
# A limit far above what the job does would flatten its bars: drawn only
# when within this factor of the highest bar.
LIMIT_ON_SCALE = 2.0


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    rows: float  # rows done in the bucket
    rows_per_sec: float
    label: str  # what hovering shows


@dataclass(frozen=True)
class Tick:
    at: float  # x or y in the drawing
    label: str


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    limit_y: float | None  # the dashed line of the job's rows/s limit, if on the scale
    limit_label: str
    peak: float  # rows/s of the highest bar

    width: float = WIDTH
    height: float = HEIGHT
    left: float = LEFT
    top: float = TOP
    plot_w: float = PLOT_W
    plot_h: float = PLOT_H


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is at least ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10.0 * power


def since(seconds: float, total: float) -> str:
    """A time on the chart's axis: tenths of a second on a chart of a few."""
    return f"{seconds:.1f}s" if total < 10 else duration(seconds)


def draw(series: Throughput, limit: float | None = None) -> Chart:
    """The geometry of the chart of ``series``; ``limit``: the job's
    ``max_rows_per_sec`` (None or 0: none)."""
    rates = series.rows_per_sec
    peak = max(rates, default=0.0)
    on_scale = bool(limit) and limit is not None and (peak == 0 or limit <= LIMIT_ON_SCALE * peak)
    top = nice_ceiling(max(peak, limit if on_scale and limit else 0.0))
    slot = PLOT_W / max(len(rates), 1)
    gap = min(1.0, slot * 0.1)
    bars = []
    for i, (rows, per_sec) in enumerate(zip(series.rows, rates, strict=True)):
        height = PLOT_H * per_sec / top
        start, end = i * series.bucket_seconds, (i + 1) * series.bucket_seconds
        bars.append(Bar(
            x=LEFT + i * slot + gap / 2, y=TOP + PLOT_H - height, width=slot - gap,
            height=height, rows=rows, rows_per_sec=per_sec,
            label=f"+{since(start, series.seconds)} to +{since(end, series.seconds)}: "
                  f"{rate(per_sec) if per_sec else 0} "
                  f"rows/s ({rows:,.0f} rows)"))
    y_ticks = [Tick(TOP + PLOT_H * (1 - f), f"{top * f:,.0f}" if top >= 10 else f"{top * f:g}")
               for f in (0, 0.5, 1)]
    x_ticks = [Tick(LEFT + PLOT_W * f, f"+{since(series.seconds * f, series.seconds)}")
               for f in (0, 0.25, 0.5, 0.75, 1)]
    limit_y = TOP + PLOT_H * (1 - limit / top) if on_scale and limit else None
    limit_label = f"limit {rate(limit)} rows/s" if limit else ""
    return Chart(bars, y_ticks, x_ticks, limit_y, limit_label, peak)
