"""deploy/kubernetes/ as the cluster would get it: each overlay and example rendered by
`kubectl kustomize`, and checked against the schemas of the API it goes to.

kubectl is Debian's (scripts/ensure-kubectl.sh, run by `make test`); the core schemas come
with `kubernetes-validate`, and those of the custom resources (Prometheus Operator, KEDA,
the inference extension, Gateway API, KubeRay) are vendored in tests/data/crds/."""

from __future__ import annotations

import copy
import functools
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
CRDS = ROOT / "tests" / "data" / "crds"
OVERLAYS = ("cpu", "gpu", "gpu-tp", "replicas")
EXAMPLES = ("inference-gateway", "kuberay", "hpa", "external-redis")
TARGETS = tuple(f"overlays/{name}" for name in OVERLAYS) + tuple(
    f"examples/{name}" for name in EXAMPLES
)
# The oldest Kubernetes the manifests are for (the preStop `sleep` action is on by default
# from 1.30), and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
GATEWAY_LABELS = {"app.kubernetes.io/name": "sluicegate", "app.kubernetes.io/component": "gateway"}
POD_TEMPLATE_MARK = "x-sluicegate-pod-template"

Object = dict[str, Any]


def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is missing: run scripts/ensure-kubectl.sh (`make test` does)"
    return found


@functools.cache
def _render(target: str) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(KUBERNETES / target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"kubectl kustomize {target}:\n{result.stderr}"
    return result.stdout


def rendered_text(target: str) -> str:
    return _render(target)


def rendered(target: str) -> list[Object]:
    """The objects of one overlay or example (a fresh copy each call)."""
    return [doc for doc in yaml.safe_load_all(_render(target)) if doc]


def find(objects: list[Object], kind: str, name: str | None = None) -> Object:
    matches = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"{len(matches)} {kind} named {name}"
    return matches[0]


def kinds(objects: list[Object]) -> set[str]:
    return {o["kind"] for o in objects}


# ---- pods --------------------------------------------------------------------------------


def pod_templates(objects: list[Object]) -> Iterator[tuple[str, Object]]:
    """(where, pod template) for every pod the objects create."""
    for o in objects:
        where = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in ("Deployment", "StatefulSet"):
            yield where, o["spec"]["template"]
        elif o["kind"] == "RayCluster":
            yield f"{where} head", o["spec"]["headGroupSpec"]["template"]
            for group in o["spec"]["workerGroupSpecs"]:
                yield f"{where} {group['groupName']}", group["template"]


def gateway_pods(objects: list[Object]) -> list[tuple[str, Object]]:
    """The pod templates of the gateways: a Deployment's, or a KubeRay head's."""
    return [
        (where, template)
        for where, template in pod_templates(objects)
        if matches(GATEWAY_LABELS, template["metadata"].get("labels", {}))
    ]


def gateway_container(template: Object) -> Object:
    (container,) = [
        c for c in template["spec"]["containers"] if c["name"] in ("gateway", "ray-head")
    ]
    return container


def environment(container: Object) -> dict[str, Any]:
    """Each variable's value, or its `valueFrom` when it has no value."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# ---- schemas -----------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as a JSON Schema that refuses unknown fields, as the API
    server does under `kubectl apply --validate=strict`: objects with `properties` and no
    `x-kubernetes-preserve-unknown-fields` get `additionalProperties: false`; `nullable`
    admits null."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], Object]:
    """(apiVersion, kind) -> the vendored schema, made strict."""
    schemas = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        schema = _strict(crd["openAPIV3Schema"])
        # apiVersion, kind and metadata are the API server's to check, as for core objects.
        schema["properties"]["metadata"] = {"type": "object"}
        schemas[(crd["apiVersion"], crd["kind"])] = schema
    return schemas


def _pod_template_paths(schema: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths (with "*" for array items) where the vendored schema left a pod template out."""
    if not isinstance(schema, dict):
        return
    if schema.get(POD_TEMPLATE_MARK):
        yield path
    for name, sub in schema.get("properties", {}).items():
        yield from _pod_template_paths(sub, (*path, name))
    if "items" in schema:
        yield from _pod_template_paths(schema["items"], (*path, "*"))


def _at(document: Any, path: tuple[Any, ...]) -> Iterator[Any]:
    if not path:
        yield document
    elif path[0] == "*":
        for item in document or []:
            yield from _at(item, path[1:])
    elif isinstance(document, dict) and path[0] in document:
        yield from _at(document[path[0]], path[1:])


def schema_errors(o: Object) -> list[str]:
    """What the API server's schema would refuse in `o` (core kinds and the vendored CRDs).
    An object of a kind with no schema here is an error too: nothing goes unchecked."""
    where = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
    crd = crd_schemas().get((o.get("apiVersion", ""), o.get("kind", "")))
    if crd is not None:
        errors = [
            f"{where}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft7Validator(crd).iter_errors(o)
        ]
        # The pod templates inside a CRD (KubeRay's) are core PodTemplateSpecs.
        for path in _pod_template_paths(crd):
            for template in _at(o, path):
                pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
                pod["template"] = copy.deepcopy(template)
                errors += [f"{where} {'/'.join(path)}: {e}" for e in core_errors(pod)]
        return errors
    return [f"{where}: {e}" for e in core_errors(o)]


def core_errors(o: Object) -> list[str]:
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"Kubernetes {version}: {'/'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            errors.append(f"no schema: {e.message}")
    return errors
