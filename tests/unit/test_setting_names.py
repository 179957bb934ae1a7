"""`setting_names`: the `SLUICEGATE_*` names given that are no setting (what `serve` does with
them is tests/unit/test_cli.py), and a look through the repository for any it sets itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from sluicegate.setting_names import UnknownSetting, closest, unknown_settings
from sluicegate.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"\bSLUICEGATE_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_]*\*)")
_ON_PURPOSE = {
    "tests/unit/test_cli.py",
    "tests/unit/test_setting_names.py",
    "tests/support/test_doc_names.py",
    "src/sluicegate/setting_names.py",
    "docs/configuration.md",
}
"""Tests that give unknown names to see them refused (or planted in a page to see them
found), the module whose docstring shows what Kubernetes names, and the page that shows the
refusal."""


def test_names_of_the_environment_and_of_dotenv_that_are_no_setting(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("SLUICEGATE_PORT=9000\nsluicegate_redis=redis://r\nOTHER=1\n")
    environ = {"SLUICEGATE_MAX_WAITING": "4", "SLUICEGATE_HOST": "::", "PATH": "/bin"}
    assert unknown_settings(environ, dotenv) == [
        UnknownSetting(
            "SLUICEGATE_MAX_WAITING", "the environment", ENV_PREFIX + "MAX_ENGINE_WAITING"
        ),
        UnknownSetting("SLUICEGATE_REDIS", str(dotenv), ENV_PREFIX + "REDIS_URL"),
    ]
    assert unknown_settings({}, tmp_path / "missing.env") == []


def test_the_closest_setting_is_named_only_when_one_is_alike() -> None:
    assert closest("SLUICEGATE_PROT") == "SLUICEGATE_PORT"
    assert closest("SLUICEGATE_API_KEY") == "SLUICEGATE_API_KEYS"
    assert closest("SLUICEGATE_ZZZ") is None
    assert str(UnknownSetting("SLUICEGATE_ZZZ", ".env", None)) == (
        "unknown setting SLUICEGATE_ZZZ in .env"
    )


def test_the_repository_sets_no_sluicegate_variable_that_is_no_setting() -> None:
    """Compose files, manifests, Dockerfiles, scripts, docs and tests name real settings only
    (a `SLUICEGATE_UPSTREAM_*` family is not a name): a gateway started with one of theirs
    would refuse to start."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found: dict[str, set[str]] = {}
    for name in files:
        path = ROOT / name
        if name in _ON_PURPOSE or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for match in _NAME.findall(text):
            if match not in known:
                found.setdefault(name, set()).add(match)
    assert found == {}


def _service_links(name: str, ports: list[dict[str, object]]) -> dict[str, str]:
    """The variables Kubernetes gives every container of the namespace for a Service (its
    documented shapes: `{NAME}_SERVICE_HOST`, `{NAME}_SERVICE_PORT[_{PORT NAME}]`,
    `{NAME}_PORT`, `{NAME}_PORT_{port}_{PROTO}[_PROTO|_PORT|_ADDR]`)."""
    prefix = name.upper().replace("-", "_")
    first = ports[0]["port"]
    links = {
        f"{prefix}_SERVICE_HOST": "10.96.0.12",
        f"{prefix}_SERVICE_PORT": str(first),
        f"{prefix}_PORT": f"tcp://10.96.0.12:{first}",
    }
    for port in ports:
        number, proto = port["port"], str(port.get("protocol", "TCP"))
        if "name" in port:
            links[f"{prefix}_SERVICE_PORT_{str(port['name']).upper().replace('-', '_')}"] = str(
                number
            )
        base = f"{prefix}_PORT_{number}_{proto}"
        links[base] = f"{proto.lower()}://10.96.0.12:{number}"
        links[f"{base}_PROTO"] = proto.lower()
        links[f"{base}_PORT"] = str(number)
        links[f"{base}_ADDR"] = "10.96.0.12"
    return links


def test_the_service_links_kubernetes_gives_for_the_projects_services_are_no_unknown_settings() -> (
    None
):
    services = [
        document
        for path in sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if isinstance(document, dict) and document.get("kind") == "Service"
    ]
    ours = [s for s in services if s["metadata"]["name"].startswith("sluicegate")]
    assert {s["metadata"]["name"] for s in ours} >= {"sluicegate", "sluicegate-redis"}
    environ: dict[str, str] = {}
    for service in ours:
        environ |= _service_links(service["metadata"]["name"], service["spec"]["ports"])
    # What the deployment sets itself wins over a link of the same name (SLUICEGATE_PORT).
    environ |= {"SLUICEGATE_PORT": "8000", "SLUICEGATE_HOST": "0.0.0.0"}
    assert "SLUICEGATE_REDIS_PORT" in environ and "SLUICEGATE_SERVICE_HOST" in environ
    assert unknown_settings(environ) == []
    # A typo shaped like a link but without a link's value is still one.
    typo = {"SLUICEGATE_UPSTREAM_PORT": "8001", "SLUICEGATE_REDIS_PORT": "6380"}
    assert [u.name for u in unknown_settings(typo)] == sorted(typo)
