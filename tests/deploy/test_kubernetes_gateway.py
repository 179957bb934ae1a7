"""What the rendered Kubernetes objects promise about the gateway: its settings are real,
its probes reach the app's routes, its grace period covers its drain, it runs locked down,
only it reaches Redis, and the autoscalers, the monitoring and the inference pool read
what it exports."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripts import prometheus_rule

from sluicegate.api.health import router as health_router
from sluicegate.observability.exposition import ENGINE_STATE
from sluicegate.settings import ENV_PREFIX, Settings
from tests.deploy.kustomize import (
    GATEWAY_LABELS,
    KUBERNETES,
    TARGETS,
    environment,
    find,
    gateway_container,
    gateway_pods,
    matches,
    pod_templates,
    rendered,
)
from tests.deploy.network_policy import Pod, allowed, pods
from tests.support.monitoring import ALERTS

# What the grace period leaves the engine core and its workers to stop in after the drain:
# the "engine's shutdown (15 s)" of the manifests' comments and of docs/scaling.md#sizing.
ENGINE_SHUTDOWN_MARGIN_S = 15
GATEWAY_TARGETS = TARGETS


def gateways(target: str) -> list[tuple[str, dict[str, Any]]]:
    found = gateway_pods(rendered(target))
    assert found, f"{target} has no gateway pod"
    return found


@pytest.mark.parametrize("target", GATEWAY_TARGETS)
def test_every_sluicegate_variable_is_a_setting_with_a_valid_value(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env
    keys = tmp_path / "keys"
    keys.write_text("sk-test-key\n")
    settings = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    for where, template in gateways(target):
        env = environment(gateway_container(template))
        ours = {name: value for name, value in env.items() if name.startswith(ENV_PREFIX)}
        assert set(ours) <= settings, f"{where}: not settings: {set(ours) - settings}"
        plain = {name: value for name, value in ours.items() if isinstance(value, str)}
        # The key file is the Secret's, mounted where the variable says (checked below).
        plain[f"{ENV_PREFIX}API_KEYS"] = f"@{keys}"
        for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
            monkeypatch.delenv(name)
        for name, value in plain.items():
            monkeypatch.setenv(name, value)
        loaded = Settings()
        assert loaded.host == "0.0.0.0" and loaded.port == 8000, where


def container_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


@pytest.mark.parametrize("target", GATEWAY_TARGETS)
def test_probes_ask_the_apps_health_routes_on_its_port(target: str) -> None:
    routes = {route.path for route in health_router.routes}  # type: ignore[attr-defined]
    for where, template in gateways(target):
        container = gateway_container(template)
        port = int(environment(container)[f"{ENV_PREFIX}PORT"])
        probes = {
            kind: container[f"{kind}Probe"]["httpGet"]
            for kind in ("startup", "liveness", "readiness")
        }
        for kind, probe in probes.items():
            assert probe["path"] in routes, (where, kind)
            assert container_port(container, probe["port"]) == port, (where, kind)
        # Alive while the process answers (a drain or a dead engine must not restart it
        # mid-drain); in rotation only while the engine serves and it is not draining.
        assert probes["liveness"]["path"] == "/health"
        assert probes["readiness"]["path"] == "/ready"
        assert probes["startup"]["path"] == "/health"  # the server listens once loaded


@pytest.mark.parametrize("target", GATEWAY_TARGETS)
def test_the_grace_period_is_prestop_plus_drain_plus_engine_shutdown(target: str) -> None:
    for where, template in gateways(target):
        container = gateway_container(template)
        drain = float(environment(container)[f"{ENV_PREFIX}SHUTDOWN_TIMEOUT"])
        wait = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        grace = template["spec"]["terminationGracePeriodSeconds"]
        assert grace == wait + drain + ENGINE_SHUTDOWN_MARGIN_S, where


@pytest.mark.parametrize("target", GATEWAY_TARGETS)
def test_api_keys_are_read_from_the_secrets_file(target: str) -> None:
    for where, template in gateways(target):
        container = gateway_container(template)
        value = environment(container)[f"{ENV_PREFIX}API_KEYS"]
        assert value.startswith("@"), where
        path = Path(value[1:])
        (mount,) = [m for m in container["volumeMounts"] if path.parent == Path(m["mountPath"])]
        assert mount.get("readOnly") is True
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "sluicegate-api-keys"
        assert path.name == "keys"  # the Secret's key, as the base's instructions create it


@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_runs_unprivileged_on_a_read_only_root_with_limits(target: str) -> None:
    for where, template in pod_templates(rendered(target)):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert spec.get("automountServiceAccountToken") is False or where.startswith(
            "Deployment/sluicegate-epp"  # the picker watches pods and its pool
        ), where
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in context["capabilities"], where
            resources = container["resources"]
            for kind in ("cpu", "memory"):
                assert resources["requests"][kind] and resources["limits"][kind], where


def memory_bytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)?", quantity)
    assert match, quantity
    return float(match[1]) * 1024 ** ("  KiMiGiTi".index(match[2] or "  ") // 2)


@pytest.mark.parametrize("target", GATEWAY_TARGETS)
def test_shared_memory_fits_in_the_memory_limit(target: str) -> None:
    for where, template in pod_templates(rendered(target)):
        (shm,) = [v for v in template["spec"]["volumes"] if v["name"] == "dshm"] or [None]
        if shm is None:
            continue
        assert shm["emptyDir"]["medium"] == "Memory"
        limit = sum(
            memory_bytes(c["resources"]["limits"]["memory"]) for c in template["spec"]["containers"]
        )
        assert memory_bytes(shm["emptyDir"]["sizeLimit"]) <= limit / 4, where


def test_gpu_overlays_reserve_the_gpus_their_parallelism_uses() -> None:
    for target, gpus in (("overlays/gpu", 1), ("overlays/gpu-tp", 4)):
        ((_, template),) = gateways(target)
        container = gateway_container(template)
        env = environment(container)
        limits = container["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == gpus
        assert int(env.get(f"{ENV_PREFIX}TENSOR_PARALLEL_SIZE", "1")) == gpus
        assert container["image"].endswith(":gpu")
    ((_, template),) = gateways("overlays/cpu")
    assert "nvidia.com/gpu" not in gateway_container(template)["resources"]["limits"]


def test_the_kuberay_head_runs_the_gateway_over_every_gpu_of_the_cluster() -> None:
    raycluster = find(rendered("examples/kuberay"), "RayCluster")
    head = raycluster["spec"]["headGroupSpec"]
    env = environment(gateway_container(head["template"]))
    assert env[f"{ENV_PREFIX}DISTRIBUTED_EXECUTOR_BACKEND"] == "ray"
    world = int(env[f"{ENV_PREFIX}TENSOR_PARALLEL_SIZE"]) * int(
        env[f"{ENV_PREFIX}PIPELINE_PARALLEL_SIZE"]
    )
    gpus = int(head["rayStartParams"]["num-gpus"]) + sum(
        group["replicas"] * int(group["rayStartParams"]["num-gpus"])
        for group in raycluster["spec"]["workerGroupSpecs"]
    )
    assert world == gpus
    command = " ".join(gateway_container(head["template"])["args"])
    assert "--block" in command and "exec sluicegate serve" in command
    assert raycluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    assert matches(GATEWAY_LABELS, head["template"]["metadata"]["labels"])


# The Ray cluster's ports, on its head and its workers: GCS, dashboard, client server,
# metrics export (KubeRay's), dashboard agent, the first and last of Ray's worker ports, and
# one of the ports picked at run time (raylets, object managers, NCCL, torch.distributed).
RAY_PORTS = (6379, 8265, 10001, 8080, 52365, 10002, 19999, 43517)


def test_the_kuberay_pods_reach_each_other_on_every_ray_port_and_outsiders_only_the_api() -> None:
    objects = rendered("examples/kuberay")
    everyone = pods(objects)
    head = everyone["RayCluster/sluicegate head"]
    cluster = [pod for where, pod in everyone.items() if where.startswith("RayCluster/")]
    assert len(cluster) >= 2
    outsider = Pod("a pod of the namespace, not of the cluster", head.namespace, {}, {})
    # Pairs of a pod with itself stand for two replicas of one worker group.
    for source, target in itertools.product(cluster, repeat=2):
        for port in RAY_PORTS:
            assert allowed(objects, source, target, port), (source.where, target.where, port)
    for pod in cluster:
        for port in RAY_PORTS:
            assert not allowed(objects, outsider, pod, port), (pod.where, port)
    assert allowed(objects, outsider, head, head.ports["http"])  # the gateway's API


def test_without_the_ray_policy_the_gateway_policy_would_cut_the_workers_off_the_head() -> None:
    objects = rendered("examples/kuberay")
    everyone = pods(objects)
    head, worker = everyone["RayCluster/sluicegate head"], everyone["RayCluster/sluicegate gpu"]
    without = [o for o in objects if o["metadata"]["name"] != "sluicegate-ray"]
    assert len(without) == len(objects) - 1
    assert not allowed(without, worker, head, 6379)  # the GCS
    assert allowed(without, worker, head, head.ports["http"])


# ---- Redis ----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "examples/external-redis"])
def test_only_the_gateways_reach_redis(target: str) -> None:
    objects = rendered(target)
    policy = find(objects, "NetworkPolicy", "sluicegate-redis")
    redis = find(objects, "StatefulSet", "sluicegate-redis")["spec"]["template"]
    assert matches(policy["spec"]["podSelector"]["matchLabels"], redis["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source == {"podSelector": {"matchLabels": GATEWAY_LABELS}}
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    # Only the gateway pods carry the labels the policy lets in.
    for where, template in pod_templates(objects):
        if matches(GATEWAY_LABELS, template["metadata"]["labels"]):
            assert where in ("Deployment/sluicegate", "RayCluster/sluicegate head"), where
    # And as a cluster enforcing the policies would judge it.
    everyone = pods(objects)
    redis_pod = everyone["StatefulSet/sluicegate-redis"]
    for where, pod in everyone.items():
        assert allowed(objects, pod, redis_pod, 6379) == matches(GATEWAY_LABELS, pod.labels), where


def test_redis_takes_its_password_from_the_secret_file_never_a_command_line() -> None:
    objects = rendered("overlays/cpu")
    redis = find(objects, "StatefulSet", "sluicegate-redis")["spec"]["template"]["spec"]
    (container,) = redis["containers"]
    assert "env" not in container
    script = container["args"][0]
    assert re.search(r"redis-server \S+ - <<EOF\nrequirepass \$\(cat (\S+)\)\nEOF", script)
    secret_file = re.search(r"\$\(cat (\S+)\)", script)[1]  # type: ignore[index]
    (mount,) = [m for m in container["volumeMounts"] if secret_file.startswith(m["mountPath"])]
    (volume,) = [v for v in redis["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"] == {
        "secretName": "sluicegate-redis",
        "defaultMode": 0o440,
        "items": [{"key": "password", "path": "password"}],
    }
    for probe in ("readinessProbe", "livenessProbe"):
        assert (
            f"REDISCLI_AUTH=$(cat {secret_file}) redis-cli ping"
            in container[probe]["exec"]["command"][-1]
        )
    ((_, template),) = gateways("overlays/cpu")
    url = environment(gateway_container(template))[f"{ENV_PREFIX}REDIS_URL"]
    assert url == {"secretKeyRef": {"name": "sluicegate-redis", "key": "url"}}


def test_redis_is_a_cache_that_evicts_only_keys_with_a_ttl() -> None:
    objects = rendered("overlays/cpu")
    config = find(objects, "ConfigMap", "sluicegate-redis")["data"]["redis.conf"]
    options = dict(line.split(" ", 1) for line in config.splitlines() if line)
    # volatile-*: cache entries (all with a TTL) go, rate-limit keys (none) stay.
    assert options["maxmemory-policy"] in ("volatile-lru", "volatile-lfu")
    assert options["save"] == '""' and options["appendonly"] == "no"
    (container,) = find(objects, "StatefulSet", "sluicegate-redis")["spec"]["template"]["spec"][
        "containers"
    ]
    maxmemory = memory_bytes(options["maxmemory"].replace("mb", "Mi"))
    assert maxmemory < memory_bytes(container["resources"]["limits"]["memory"])


def test_an_external_redis_replaces_the_bundled_one() -> None:
    bundled = {o["kind"] for o in rendered("overlays/cpu") if "redis" in o["metadata"]["name"]}
    assert bundled == {"StatefulSet", "Service", "ConfigMap", "NetworkPolicy"}
    objects = rendered("examples/external-redis")
    assert not [o for o in objects if "redis" in o["metadata"]["name"]]
    ((_, template),) = gateway_pods(objects)
    url = environment(gateway_container(template))[f"{ENV_PREFIX}REDIS_URL"]
    assert url == {"secretKeyRef": {"name": "sluicegate-redis", "key": "url"}}


# ---- autoscaling, monitoring, the inference pool --------------------------------------------


def autoscaler_bounds(objects: list[dict[str, Any]]) -> tuple[int, int]:
    """The fewest and the most replicas the gateways' one autoscaler (KEDA or HPA) runs."""
    bounds = [
        # KEDA's defaults where the ScaledObject sets none.
        (o["spec"].get("minReplicaCount", 0), o["spec"].get("maxReplicaCount", 100))
        for o in objects
        if o["kind"] == "ScaledObject"
    ] + [
        (o["spec"].get("minReplicas", 1), o["spec"]["maxReplicas"])
        for o in objects
        if o["kind"] == "HorizontalPodAutoscaler"
    ]
    (found,) = bounds
    return found


@pytest.mark.parametrize(
    "target", ["overlays/replicas", "examples/hpa", "examples/inference-gateway"]
)
def test_with_redis_down_even_the_most_replicas_keep_within_each_rate_limit(target: str) -> None:
    objects = rendered(target)
    deployment = find(objects, "Deployment", "sluicegate")
    fewest, most = autoscaler_bounds(objects)
    assert fewest <= deployment["spec"]["replicas"] <= most
    env = environment(gateway_container(deployment["spec"]["template"]))
    share = float(env[f"{ENV_PREFIX}RATE_LIMIT_LOCAL_SHARE"])
    # Each replica admits `share` of every limit on its own while Redis does not answer, so
    # the fleet admits replicas x share of it: the limit itself at the autoscaler's most.
    assert share * most <= 1
    assert share == pytest.approx(1 / most)


def test_keda_scales_the_deployment_on_the_engine_queue_of_its_namespace() -> None:
    objects = rendered("overlays/replicas")
    scaled = find(objects, "ScaledObject", "sluicegate")
    assert (
        scaled["spec"]["scaleTargetRef"]["name"] == find(objects, "Deployment")["metadata"]["name"]
    )
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert "vllm:num_requests_waiting" in query
    assert f'namespace="{scaled["metadata"]["namespace"]}"' in query
    assert 'job="sluicegate"' in query


def test_the_hpa_reads_the_metric_prometheus_adapter_serves() -> None:
    values = yaml.safe_load(
        (KUBERNETES / "components" / "hpa" / "prometheus-adapter-values.yaml").read_text()
    )
    (rule,) = values["rules"]["custom"]
    served = re.sub(
        rule["name"]["matches"],
        rule["name"]["as"].replace("${1}", r"\1"),
        "vllm:num_requests_waiting",
    )
    assert re.search(rule["seriesQuery"].split('"')[1], "vllm:num_requests_waiting")
    hpa = find(rendered("examples/hpa"), "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == served
    assert "ScaledObject" not in {o["kind"] for o in rendered("examples/hpa")}


def test_the_prometheus_rule_holds_exactly_the_alert_rules() -> None:
    rule_file = prometheus_rule.RULE
    assert rule_file.read_text() == prometheus_rule.render(), "run `make docs`"
    rule = find(rendered("overlays/gpu"), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


@pytest.mark.parametrize("target", ["overlays/gpu", "examples/kuberay"])
def test_the_pod_monitor_scrapes_the_gateways_as_the_job_the_alerts_name(target: str) -> None:
    objects = rendered(target)
    monitor = find(objects, "PodMonitor")["spec"]
    alerts = ALERTS.read_text()
    for where, template in gateway_pods(objects):
        labels = template["metadata"]["labels"]
        assert matches(monitor["selector"]["matchLabels"], labels), where
        assert f'job="{labels[monitor["jobLabel"]]}"' in alerts
        (endpoint,) = monitor["podMetricsEndpoints"]
        assert endpoint["path"] == "/metrics"
        port = container_port(gateway_container(template), endpoint["port"])
        assert port == int(environment(gateway_container(template))[f"{ENV_PREFIX}PORT"])


def picker_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config = find(objects, "ConfigMap", "sluicegate-epp")["data"]["config.yaml"]
    return dict(yaml.safe_load(config))


def test_the_inference_pool_selects_the_gateways_on_their_port() -> None:
    objects = rendered("examples/inference-gateway")
    pool = find(objects, "InferencePool")["spec"]
    ((_, template),) = gateway_pods(objects)
    assert matches(pool["selector"]["matchLabels"], template["metadata"]["labels"])
    port = int(environment(gateway_container(template))[f"{ENV_PREFIX}PORT"])
    assert pool["targetPorts"] == [{"number": port}]
    picker = find(objects, "Service", pool["endpointPickerRef"]["name"])
    assert pool["endpointPickerRef"]["port"]["number"] in {
        p["port"] for p in picker["spec"]["ports"]
    }
    epp = find(objects, "Deployment", "sluicegate-epp")
    assert matches(picker["spec"]["selector"], epp["spec"]["template"]["metadata"]["labels"])
    args = gateway_container_args(epp)
    assert args[args.index("--pool-name") + 1] == find(objects, "InferencePool")["metadata"]["name"]
    route = find(objects, "HTTPRoute")["spec"]
    assert (
        route["rules"][0]["backendRefs"][0]["name"]
        == find(objects, "InferencePool")["metadata"]["name"]
    )


def gateway_container_args(deployment: dict[str, Any]) -> list[str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def test_the_picker_reads_the_gateways_by_their_engine_type_label() -> None:
    objects = rendered("examples/inference-gateway")
    config = picker_config(objects)
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    (engine,) = extractor["parameters"]["engineConfigs"]
    ((_, template),) = gateway_pods(objects)
    labels = template["metadata"]["labels"]
    for key in ("inference.networking.k8s.io/engine-type", "llm-d.ai/engine-type"):
        assert labels[key] == engine["name"]
    assert extractor["parameters"]["defaultEngine"] == engine["name"]
    (source,) = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    routes = {route.path for route in health_router.routes}  # type: ignore[attr-defined]
    assert source["parameters"]["path"] == "/metrics/engine" in routes
    # sluicegate serves LoRA adapters: the picker reads them, and scores the pods on them.
    assert engine["loraSpec"] == "vllm:lora_requests_info"
    (profile,) = config["schedulingProfiles"]
    assert "lora-affinity-scorer" in {plugin["pluginRef"] for plugin in profile["plugins"]}
    # /metrics/engine renders these (tests/integration/test_parallel_engine.py checks it
    # against the real engine).
    specs = {value for key, value in engine.items() if key.endswith("Spec") and value}
    assert specs <= set(ENGINE_STATE)
    assert {
        engine[spec] for spec in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")
    } == {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"}


@pytest.mark.parametrize("target", GATEWAY_TARGETS)
def test_the_lora_snapshots_have_a_disk_volume_of_their_own_within_the_storage_limit(
    target: str,
) -> None:
    """TMPDIR (where every adapter is copied) is a volume on disk with room for adapters, not
    a small /tmp nor memory, and the emptyDirs fit in the ephemeral-storage limit that would
    evict the pod."""
    for where, template in gateways(target):
        container = gateway_container(template)
        folder = environment(container).get("TMPDIR", "/tmp")
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        snapshots = volumes[mount["name"]]["emptyDir"]
        assert snapshots.get("medium") != "Memory", where
        assert memory_bytes(snapshots["sizeLimit"]) >= 2 * 1024**3, where
        on_disk = sum(
            memory_bytes(v["emptyDir"]["sizeLimit"])
            for v in volumes.values()
            if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
        )
        assert on_disk <= memory_bytes(container["resources"]["limits"]["ephemeral-storage"])
