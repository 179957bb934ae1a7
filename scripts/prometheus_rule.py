"""Writes deploy/kubernetes/components/monitoring/prometheusrule.yaml from the alert rules.

deploy/prometheus/alerts.yml is the one text of the alerts (promtool checks and unit-tests
it); the Prometheus Operator wants the same groups inside a PrometheusRule. This wraps them,
comments and all. `make docs` runs it with `--write`; a test in tests/deploy/ fails when the
two files disagree.

    python scripts/prometheus_rule.py [--write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE = ROOT / "deploy" / "kubernetes" / "components" / "monitoring" / "prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/alerts.yml by `make docs` (scripts/prometheus_rule.py);
# edit that file, not this one.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: sluicegate
  labels:
    app.kubernetes.io/name: sluicegate
    app.kubernetes.io/component: gateway
spec:
"""


def render() -> str:
    """The PrometheusRule: alerts.yml from its `groups:` line on, indented under `spec`."""
    lines = ALERTS.read_text(encoding="utf-8").splitlines()
    start = lines.index("groups:")
    body = [f"  {line}" if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {RULE.name}")
    args = parser.parse_args()
    text = render()
    if args.write:
        RULE.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
