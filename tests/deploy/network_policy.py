"""Which pod may open a connection to which, as a network plugin that enforces the rendered
NetworkPolicies would decide it, so that tests ask about traffic rather than rule shapes.

It judges what the manifests use, TCP connections under ingress policies of one namespace
with `matchLabels` pod selectors and ports by number or name, and fails a test on anything
else (egress rules, `namespaceSelector`, `ipBlock`, `matchExpressions`) rather than guess."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.deploy.kustomize import Object, pod_templates

# What KubeRay adds to every pod of a RayCluster (labelPod in
# ray-operator/controllers/ray/common/pod.go): the template may override these...
KUBERAY_DEFAULT_LABELS = {
    "ray.io/is-ray-node": "yes",
    "app.kubernetes.io/name": "kuberay",
    "app.kubernetes.io/created-by": "kuberay-operator",
}
# ...but not these, the cluster's name, the node type and the group.
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_HEAD_GROUP = "headgroup"


@dataclass(frozen=True)
class Pod:
    where: str
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int]  # the containers' named ports


def pods(objects: list[Object]) -> dict[str, Pod]:
    """Every pod the objects create, by where it comes from, with the labels it runs with."""
    owners = {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}
    found = {}
    for where, template in pod_templates(objects):
        owner = owners[where.split(" ")[0]]
        labels = dict(template["metadata"].get("labels", {}))
        if owner["kind"] == "RayCluster":
            labels = {**KUBERAY_DEFAULT_LABELS, **labels, **_kuberay_labels(owner, where)}
        ports = {
            port["name"]: int(port["containerPort"])
            for container in template["spec"]["containers"]
            for port in container.get("ports", [])
            if "name" in port
        }
        found[where] = Pod(where, owner["metadata"]["namespace"], labels, ports)
    return found


def _kuberay_labels(cluster: Object, where: str) -> dict[str, str]:
    name = cluster["metadata"]["name"]
    group = where.split(" ", 1)[1]
    node_type = "head" if group == "head" else "worker"
    return {
        RAY_CLUSTER_LABEL: name,
        "ray.io/node-type": node_type,
        "ray.io/group": RAY_HEAD_GROUP if node_type == "head" else group,
        "ray.io/identifier": f"{name}-{node_type}",
    }


def allowed(objects: list[Object], source: Pod, target: Pod, port: int) -> bool:
    """Whether `source` may open a TCP connection to `target` on `port`."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for policy in policies:
        assert policy["metadata"]["namespace"] == source.namespace == target.namespace
        assert policy["spec"]["policyTypes"] == ["Ingress"], "the evaluator judges ingress only"
    applying = [p for p in policies if selects(p["spec"]["podSelector"], target.labels)]
    if not applying:
        return True  # a pod no policy selects takes any traffic
    return any(
        _peers_admit(rule.get("from"), source) and _ports_admit(rule.get("ports"), port, target)
        for policy in applying
        for rule in policy["spec"].get("ingress", [])
    )


def _peers_admit(peers: list[Object] | None, pod: Pod) -> bool:
    if not peers:
        return True
    for peer in peers:
        assert set(peer) == {"podSelector"}, f"the evaluator does not judge {peer}"
    return any(selects(peer["podSelector"], pod.labels) for peer in peers)


def _ports_admit(ports: list[Object] | None, port: int, target: Pod) -> bool:
    if not ports:
        return True
    return any(_port_admits(rule, port, target) for rule in ports)


def _port_admits(rule: Object, port: int, target: Pod) -> bool:
    if rule.get("protocol", "TCP") != "TCP":
        return False
    if "port" not in rule:
        return True
    named = isinstance(rule["port"], str)  # the target's container port of that name
    first: int | None = target.ports.get(rule["port"]) if named else int(rule["port"])
    if first is None:
        return False
    return first <= port <= int(rule.get("endPort", first))


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict; the empty selector selects every pod."""
    assert set(selector) <= {"matchLabels"}, f"the evaluator does not judge {selector}"
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())
