"""The PromQL that deploy/ ships, read out of the dashboard JSON and the alert rules."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy/prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD = ROOT / "deploy/grafana/dashboards/sluicegate.json"

_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$")
_NUMBER = re.compile(r"^\s*\(?\s*[-+]?[0-9.]+(e[-+]?\d+)?\s*\)?\s*$")
_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
_SET_OPERATORS = ("and", "or", "unless")


@dataclass(frozen=True)
class Query:
    where: str
    expr: str


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_panels() -> list[dict[str, Any]]:
    return [p for p in _panels(load_dashboard()["panels"]) if p.get("type") != "row"]


def dashboard_queries() -> list[Query]:
    """Every target expression of every panel."""
    return [
        Query(f"panel {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]


def variable_queries() -> list[Query]:
    """The query variables, as PromQL: `label_values(m{...}, l)` is `count by (l) (m{...})`."""
    queries = []
    for variable in load_dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        definition = variable["query"]["query"]
        match = _LABEL_VALUES.match(definition)
        assert match, f"variable {variable['name']}: unexpected query {definition}"
        queries.append(
            Query(
                f"variable {variable['name']}",
                f"count by ({match['label']}) ({match['selector']})",
            )
        )
    return queries


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace Grafana variables (`$name`, `${name}`), longest names first."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def operands(expr: str) -> list[str]:
    """The operands of the top-level comparisons and set operations of `expr`, numbers left
    out: what must have data for the whole expression to mean anything."""
    parts, depth, start, i, quote = [], 0, 0, 0, ""
    while i < len(expr):
        char = expr[i]
        if quote:
            if char == "\\":
                i += 2
                continue
            if char == quote:
                quote = ""
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0:
            width = _operator_at(expr, i)
            if width:
                parts.append(expr[start:i])
                i += width
                rest = expr[i:].lstrip()
                if rest.startswith("bool") and not rest[4:5].isalnum():
                    i = len(expr) - len(rest) + len("bool")
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip() and not _NUMBER.match(p)]


def _operator_at(expr: str, i: int) -> int:
    for op in _COMPARISONS:
        if expr.startswith(op, i) and not expr.startswith("=~", i) and not expr.startswith("!~", i):
            return len(op)
    for word in _SET_OPERATORS:
        end = i + len(word)
        if (
            expr.startswith(word, i)
            and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:"))
            and (end == len(expr) or not (expr[end].isalnum() or expr[end] in "_:"))
        ):
            return len(word)
    return 0


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (`_bucket`, `_count`, `_sum` kept)."""
    return set(re.findall(r"\b(?:sluicegate_[a-z_]+|vllm:[a-z_:]+|up)\b(?=\s*[{\[)])", expr))
