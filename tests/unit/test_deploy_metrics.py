"""The monitoring shipped in deploy/ (issue 26): every alert expression of
deploy/prometheus/alerts.yml and every query of the Grafana dashboard
deploy/grafana/reorg.json names only metrics the workers export (the
registry of framework/metrics.py), and the alerts fire as their unit tests
(deploy/prometheus/alerts_test.yml, run by ``promtool test rules``) say."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from framework import metrics

DEPLOY = Path(__file__).parents[2] / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "reorg.json"

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan"}
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers that are
    not functions, keywords, label names or parts of durations."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges
    expr = _CLAUSE.sub(" ", expr)  # by (...), on (...)
    expr = re.sub(r"\b\d+(\.\d+)?([smhdwy]|ms)?\b", " ", expr)  # numbers, durations
    names = set()
    for match in _NAME.finditer(expr):
        rest = expr[match.end():].lstrip()
        if rest.startswith("(") or match.group().lower() in _KEYWORDS:
            continue  # a function or an aggregation, or an operator
        names.add(match.group())
    return names


def _alert_exprs() -> dict[str, str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def _dashboard_queries() -> dict[str, str]:
    dash = json.loads(DASHBOARD.read_text())
    queries = {f"panel {p['title']!r} {t['refId']}": t["expr"]
               for p in dash["panels"] for t in p.get("targets", [])}
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            # label_values(METRIC, LABEL): the metric is the one name read.
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            found = re.fullmatch(r"label_values\((\w+)\s*,\s*\w+\)", query)
            assert found, query
            queries[f"variable {var['name']}"] = found.group(1)
    return queries


def test_the_name_extraction_sees_the_names_and_only_them() -> None:
    expr = ('(time() - max by (job_id) (reorg_job_progress_timestamp_seconds)) > 15 * 60 '
            'and on (job_id) max by (job_id) (reorg_job_state{state="running"}) == 1 '
            'unless on (job_id) sum by (instance) (increase(reorg_leases_lost_total[10m])) > 0')
    assert metric_names(expr) == {"reorg_job_progress_timestamp_seconds", "reorg_job_state",
                                  "reorg_leases_lost_total"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))") == {
        "x_bucket"}


def test_every_alert_and_panel_names_only_metrics_the_workers_export() -> None:
    exported = metrics.sample_names()
    assert {"reorg_job_rows_done", "reorg_batches_total", "reorg_build_info",
            "reorg_batch_duration_seconds_bucket"} <= exported
    assert "reorg_job_rows_total" not in exported  # a gauge, so no counter's suffix
    queries = {**{f"alert {k}": v for k, v in _alert_exprs().items()}, **_dashboard_queries()}
    assert len(queries) > 20
    unknown = {where: sorted(metric_names(q) - exported) for where, q in queries.items()
               if metric_names(q) - exported}
    assert unknown == {}
    for where, query in queries.items():
        assert metric_names(query), f"{where} reads no metric: {query}"
    # Every alert the issue asks for is there.
    assert set(_alert_exprs()) == {"ReorgJobFailed", "ReorgJobStalled", "ReorgJobThrottledLong",
                                   "ReorgNoOwner", "ReorgLeasesLost", "ReorgReplicaLag"}


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool (Debian package prometheus) is not installed; .ci/run "
                           "installs it")
def test_the_alerts_fire_as_their_unit_tests_say() -> None:
    result = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"],
                            cwd=ALERTS.parent, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
