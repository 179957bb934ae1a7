"""deploy/prometheus and deploy/grafana: promtool's checks, and what the dashboard reads.

promtool comes with Debian's `prometheus` package (`scripts/ensure-prometheus.sh`, run by
`make test` and `make unit`)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from prometheus_client import REGISTRY

import sluicegate.observability.metrics  # noqa: F401  (declares every sluicegate_* series)
from sluicegate.paths import INFERENCE_PATHS
from tests.support.monitoring import (
    PROMETHEUS_DIR,
    alert_rules,
    dashboard_panels,
    dashboard_queries,
    load_dashboard,
    metric_names,
    operands,
    variable_queries,
)


def promtool(*args: str) -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: run scripts/ensure-prometheus.sh"
    result = subprocess.run(
        [binary, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_prometheus_config_passes_promtool() -> None:
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")


def test_alert_rules_pass_promtool() -> None:
    assert "SUCCESS: 9 rules found" in promtool("check", "rules", "alerts.yml")


def test_alert_rules_pass_their_unit_tests() -> None:
    assert "SUCCESS" in promtool("test", "rules", "alerts.test.yml")


def test_alerts_cover_what_ops_page_on_each_with_a_duration_and_severity() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert set(rules) == {
        "SluicegateDown",
        "SluicegateHighErrorRatio",
        "SluicegateSlowTimeToFirstToken",
        "SluicegateSlowRequests",
        "SluicegateCacheHitRatioDrop",
        "SluicegateKvCacheAlmostFull",
        "SluicegateWaitingQueueGrowing",
        "SluicegateManagedKeysLost",
        "SluicegateManagedKeyRecordsSkipped",
    }
    for name, rule in rules.items():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    assert "vllm:kv_cache_usage_perc" in rules["SluicegateKvCacheAlmostFull"]["expr"]
    assert "vllm:num_requests_waiting" in rules["SluicegateWaitingQueueGrowing"]["expr"]


def test_dashboard_has_datasource_model_and_instance_variables() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"model", "instance"} <= set(variables)
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert "$instance" in target["expr"], (panel["title"], target["expr"])


def test_dashboard_answers_the_incident_questions() -> None:
    panels = {panel["title"]: panel for panel in dashboard_panels()}
    assert {
        "Requests per second by status",
        "End-to-end latency",
        "Time to first token",
        "Inter-token latency",
        "Tokens per second",
        "Response cache hit ratio",
        "In flight and waiting",
        "KV cache usage",
        "Prefix-cache hit rate",
        "Token budget: trims and clamps",
        "Errors by type",
    } <= set(panels)
    latency = " ".join(t["expr"] for t in panels["End-to-end latency"]["targets"])
    assert all(f"histogram_quantile({q}," in latency for q in ("0.5", "0.95", "0.99"))


def test_the_error_ratio_alert_counts_every_inference_route() -> None:
    """All of them, in the numerator and the denominator: an alert on two routes of seven
    stays quiet while embeddings, messages or the Responses API fail."""
    (rule,) = [rule for rule in alert_rules() if rule["alert"] == "SluicegateHighErrorRatio"]
    matchers = re.findall(r'endpoint=~"([^"]*)"', rule["expr"])
    assert len(matchers) == 3
    for matcher in matchers:
        assert set(matcher.split("|")) == INFERENCE_PATHS


def test_every_sluicegate_series_the_dashboard_and_alerts_read_is_declared() -> None:
    declared = {
        sample_name
        for family in REGISTRY.collect()
        if family.name.startswith("sluicegate_")
        for sample_name in _sample_names(family.name, family.type)
    }
    exprs = [q.expr for q in [*dashboard_queries(), *variable_queries()]]
    exprs += [rule["expr"] for rule in alert_rules()]
    used = {name for expr in exprs for name in metric_names(expr)}
    assert {n for n in used if n.startswith("sluicegate_")} - declared == set()
    assert any(n.startswith("vllm:") for n in used)


def _sample_names(name: str, kind: str) -> set[str]:
    if kind == "counter":
        return {f"{name}_total"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return {name}


def test_no_sluicegate_metric_name_contains_vllm() -> None:
    # vLLM unregisters every collector whose name contains "vllm" when its engine starts.
    names = [f.name for f in REGISTRY.collect() if f.name.startswith("sluicegate_")]
    assert names and not [n for n in names if "vllm" in n]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('up{job="x"} == 0', ['up{job="x"}']),
        ("a / b > 0.05", ["a / b"]),
        ('(x{a="1"} or y * 0) / z > bool 1', ['(x{a="1"} or y * 0) / z']),
        ("a < 0.5 * (b) and (c) > 0.1 and d > 0.05", ["a", "0.5 * (b)", "(c)", "d"]),
        ('sum by (instance) (m{l!="x", k=~"a|b"})', ['sum by (instance) (m{l!="x", k=~"a|b"})']),
        ("floor(x) >= 2 unless sort_desc(y)", ["floor(x)", "sort_desc(y)"]),
    ],
)
def test_operands_are_the_top_level_sides_of_comparisons_and_set_operations(
    expr: str, expected: list[str]
) -> None:
    assert operands(expr) == expected
