"""deploy/kubernetes/: every overlay and example renders, every object it renders passes its
API's schema (strict: no unknown field) and checkov, with each skipped check explained.

No cluster is needed: `kubectl kustomize` renders, kubernetes-validate and the vendored CRD
schemas (tests/data/crds/) validate, checkov lints (tests/deploy/kustomize.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kustomize import (
    KUBERNETES,
    ROOT,
    TARGETS,
    find,
    kinds,
    rendered,
    rendered_text,
    schema_errors,
)

# Core objects every target has: the gateway's namespace, service, disruption budget and
# Redis with its network policy.
CORE_KINDS = {"Namespace", "Service", "PodDisruptionBudget", "StatefulSet", "NetworkPolicy"}
EXPECTED_KINDS = {
    "overlays/cpu": CORE_KINDS | {"Deployment"},
    "overlays/gpu": CORE_KINDS | {"Deployment", "PodMonitor", "PrometheusRule"},
    "overlays/gpu-tp": CORE_KINDS | {"Deployment", "PodMonitor", "PrometheusRule"},
    "overlays/replicas": CORE_KINDS
    | {"Deployment", "PodMonitor", "PrometheusRule", "ScaledObject"},
    "examples/hpa": CORE_KINDS
    | {"Deployment", "PodMonitor", "PrometheusRule", "HorizontalPodAutoscaler"},
    "examples/inference-gateway": CORE_KINDS
    | {"Deployment", "InferencePool", "HTTPRoute", "Role", "RoleBinding", "ScaledObject"},
    "examples/kuberay": CORE_KINDS | {"RayCluster", "PodMonitor"},
    "examples/external-redis": {"Namespace", "Service", "PodDisruptionBudget", "Deployment"},
}

# Checks skipped for every object, each with the reason; object-specific skips are
# `checkov.io/skip<n>: CHECK=reason` annotations on the object itself.
SKIPPED_CHECKS = {
    "CKV_K8S_43": "Images by digest: the gateway images are built from this repository and "
    "pushed to the user's registry, so there is no digest to write here, and no registry is "
    "reachable where these files are tested to read Redis's. Pin both in your overlay "
    "(`kustomize edit set image sluicegate=REGISTRY/sluicegate@sha256:...`), as "
    "docs/scaling.md says.",
}


@pytest.mark.parametrize("target", TARGETS)
def test_every_overlay_and_example_renders_what_it_promises(target: str) -> None:
    objects = rendered(target)
    assert EXPECTED_KINDS[target] <= kinds(objects), kinds(objects)
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == "sluicegate", o["metadata"]["name"]
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "sluicegate"


def test_every_kustomization_is_rendered_by_a_test() -> None:
    """A new overlay or component is picked up here, or this fails."""
    folders = {
        str(path.parent.relative_to(KUBERNETES)) for path in KUBERNETES.rglob("kustomization.yaml")
    }
    components = {f for f in folders if f.startswith("components/")}
    assert folders - components - {"base"} == set(TARGETS)
    used = set()
    for target in TARGETS:
        for folder in (KUBERNETES / target).resolve(), *_bases(KUBERNETES / target):
            document = yaml.safe_load((folder / "kustomization.yaml").read_text())
            for component in document.get("components", []):
                used.add(str((folder / component).resolve().relative_to(KUBERNETES)))
    assert components == used, f"components no target uses: {components - used}"


def _bases(folder: Path) -> list[Path]:
    document = yaml.safe_load((folder / "kustomization.yaml").read_text())
    found = []
    for resource in document.get("resources", []):
        path = (folder / resource).resolve()
        if path.is_dir():
            found += [path, *_bases(path)]
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_passes_its_api_schema_strictly(target: str) -> None:
    errors = [error for o in rendered(target) for error in schema_errors(o)]
    assert errors == []


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ("spec", "template", "spec", "containers", 0, "readinesProbe"), {}),
        ("Deployment", ("spec", "template", "spec", "terminationGracePeriodSeconds"), "55s"),
        ("InferencePool", ("spec", "targetPorts", 0, "number"), 70000),
        ("InferencePool", ("spec", "endpointPickerRef", "failureMode"), "FailSometimes"),
        ("ScaledObject", ("spec", "triggers", 0, "metadata", "query"), 5),
        ("PodMonitor", ("spec", "podMetricsEndpoint"), []),
        ("HTTPRoute", ("spec", "rules", 0, "timeouts", "request"), "eleven minutes"),
    ],
)
def test_the_schema_check_catches_mistakes(kind: str, path: tuple[Any, ...], value: Any) -> None:
    target = "examples/inference-gateway"
    o = next(o for o in rendered(target) if o["kind"] == kind)
    assert schema_errors(o) == []
    node = o
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert schema_errors(o), f"a wrong {kind} {'.'.join(map(str, path))} passed"


def test_the_pod_templates_inside_a_raycluster_are_checked_too() -> None:
    raycluster = find(rendered("examples/kuberay"), "RayCluster")
    assert schema_errors(raycluster) == []
    worker = raycluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["securityContext"]["readOnlyRootFilesystm"] = True
    assert any("readOnlyRootFilesystm" in error for error in schema_errors(raycluster))


def test_an_object_of_an_unknown_kind_is_an_error() -> None:
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert schema_errors(unknown)


# ---- checkov -----------------------------------------------------------------------------


def checkov() -> str:
    """checkov lives in its own virtual environment (.venv-tools, made by `make test`): its
    pins would downgrade packages that vLLM and torch need."""
    candidates = [os.environ.get("CHECKOV"), str(ROOT / ".venv-tools" / "bin" / "checkov")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    found = shutil.which("checkov")
    assert found, "checkov is missing: `make test` installs it into .venv-tools"
    return found


@pytest.fixture(scope="module")
def checkov_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("rendered")
    for target in TARGETS:
        (folder / f"{target.replace('/', '-')}.yaml").write_text(rendered_text(target))
    result = subprocess.run(
        [
            checkov(),
            "--directory",
            str(folder),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--skip-download",
            "--skip-check",
            ",".join(SKIPPED_CHECKS),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads(result.stdout)
    return dict(report[0] if isinstance(report, list) else report)


def test_checkov_passes_on_every_rendered_object(checkov_report: dict[str, Any]) -> None:
    results = checkov_report["results"]
    failed = [
        f"{check['check_id']} {check['resource']} ({check['file_path']}): {check['check_name']}"
        for check in results["failed_checks"]
    ]
    assert failed == []
    assert len(results["passed_checks"]) > 500  # it did look at the objects


def test_every_skipped_check_has_a_written_reason(checkov_report: dict[str, Any]) -> None:
    for check, reason in SKIPPED_CHECKS.items():
        assert len(reason.split()) >= 8, check
    reasons = {}
    for target in TARGETS:
        for o in rendered(target):
            for key, value in o["metadata"].get("annotations", {}).items():
                if key.startswith("checkov.io/skip"):
                    check, _, reason = value.partition("=")
                    assert check.startswith("CKV_") and len(reason.split()) >= 8, value
                    reasons[check] = reason
    assert reasons, "no object skips a check: are the annotations gone?"
    # checkov honoured each annotation, and skipped nothing else.
    skipped = checkov_report["results"]["skipped_checks"]
    assert {check["check_id"] for check in skipped} == set(reasons)
    for check in skipped:
        assert check["check_result"]["suppress_comment"] == reasons[check["check_id"]]
