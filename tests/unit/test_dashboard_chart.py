"""The dashboard's rows/s chart (its geometry, drawn on the server), the
alter form's parsing and how a job's parameters are listed: no server, no
browser (tests/acceptance/test_dashboard.py has those)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cli.dashboard import actions, reads
from cli.dashboard.app import breakable
from cli.dashboard.chart import PLOT_H, TOP, draw, nice_ceiling, since
from framework.errors import InvalidParams
from framework.store.throughput import Throughput

START = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("value", "ceiling"), [
    (0, 1), (0.3, 0.5), (1, 1), (1.5, 2), (3, 5), (7, 10), (10, 10), (1_500, 2_000), (50_001, 100_000)])
def test_the_scale_ends_on_a_round_number(value: float, ceiling: float) -> None:
    assert nice_ceiling(value) == pytest.approx(ceiling)


def test_each_bar_is_its_intervals_rate_on_the_scale() -> None:
    chart = draw(Throughput(START, 2.0, [0, 200, 100, 0]))
    assert [b.rows_per_sec for b in chart.bars] == [0, 100, 50, 0]
    assert [b.rows for b in chart.bars] == [0, 200, 100, 0]
    assert [b.height for b in chart.bars] == [0, PLOT_H, PLOT_H / 2, 0]
    assert all(b.y + b.height == TOP + PLOT_H for b in chart.bars)  # standing on the axis
    assert [t.label for t in chart.y_ticks] == ["0", "50", "100"]
    assert [t.label for t in chart.x_ticks] == ["+0.0s", "+2.0s", "+4.0s", "+6.0s", "+8.0s"]
    assert chart.bars[1].label == "+2.0s to +4.0s: 100 rows/s (200 rows)"
    assert chart.peak == 100 and chart.limit_y is None and chart.limit_label == ""
    # Side by side, left to right, none overlapping.
    assert all(a.x + a.width < b.x for a, b in zip(chart.bars, chart.bars[1:], strict=False))


def test_the_limit_is_drawn_when_on_the_scale_and_named_when_far_above() -> None:
    series = Throughput(START, 60.0, [6_000, 3_000])  # 100 and 50 rows/s, over two minutes
    near = draw(series, limit=150)
    assert near.y_ticks[-1].label == "200"  # the scale grows to hold the limit
    assert near.limit_y == pytest.approx(TOP + PLOT_H * (1 - 150 / 200))
    assert near.limit_label == "limit 150 rows/s"
    assert [t.label for t in near.x_ticks] == ["+0s", "+30s", "+1m00s", "+1m30s", "+2m00s"]
    far = draw(series, limit=10_000)
    assert far.limit_y is None and far.limit_label == "limit 10,000 rows/s"
    assert far.y_ticks[-1].label == "100"  # the bars keep their height


def test_a_job_with_no_rows_yet_draws_flat() -> None:
    chart = draw(Throughput(START, 0.5, [0.0, 0.0]))
    assert [b.height for b in chart.bars] == [0, 0] and chart.peak == 0
    assert since(0.25, 1.0) == "0.2s" and since(90, 600) == "1m30s"


def test_the_alter_form_gives_control_alter_its_arguments() -> None:
    assert actions.parse_alter({"batch_rows": " 200 ", "max_rows_per_sec": "0",
                                "max_replica_lag": "1.5", "concurrency": "",
                                "token": "t"}) == {
        "batch_rows": 200, "max_rows_per_sec": 0, "max_replica_lag": 1.5}


@pytest.mark.parametrize(("form", "message"), [
    ({"batch_rows": "lots"}, "--batch-rows must be a whole number, got 'lots'"),
    ({"concurrency": "2.5"}, "--concurrency must be a whole number, got '2.5'"),
    ({"max_replica_lag": "soon"}, "--max-replica-lag must be a number of seconds, got 'soon'"),
    ({"max_replica_lag": "nan"}, "--max-replica-lag must be a number of seconds, got 'nan'"),
    ({"batch_rows": " ", "token": "t"}, "nothing to change: fill in at least one of batch rows"),
])
def test_a_bad_alter_form_is_one_line_naming_the_field(form: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidParams) as refused:
        actions.parse_alter(form)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_parameters_are_listed_what_the_job_changes_first() -> None:
    params = {"work_schema": "reorg", "run_as": "alice", "rows_per_subtask": 300,
              "where": "id > 5", "set": "c = md5(b)", "table": "items", "add_column": None,
              "overwrite": True, "empty": ""}
    assert reads.params_shown(params) == [
        ("table", "items"), ("set", "c = md5(b)"), ("where", "id > 5"),
        ("overwrite", "true"), ("rows_per_subtask", "300")]


def test_a_long_table_name_breaks_between_its_words_only() -> None:
    assert str(breakable("public.items_x")) == "public.<wbr>items_<wbr>x"
    assert str(breakable('a<b"')) == "a&lt;b&#34;"
