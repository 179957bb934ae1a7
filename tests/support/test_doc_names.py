"""The names README.md and `docs/` write are real: settings, metrics, make targets, files,
modules and tests.

A page that names a setting that does not exist sends an operator to set a variable the
gateway refuses at start (or, before that refusal, silently ignored); a metric that is not
registered gives a dashboard with no data; a make target, a file or a test that is gone, a
dead end.
Each check reads the pages as text and compares with the tree:

- settings: every `UPPER_SNAKE` word outside fenced blocks, and every `SLUICEGATE_*` one
  inside them (a shell example sets other programs' variables too), with or without the
  `SLUICEGATE_` prefix, is a field of `Settings`, unless other programs read it
  (`OTHER_PROGRAMS`) or the project's files do (`PROJECT_VARIABLES`). A name written after
  "unknown setting" is the example of the refusal of a mistyped one;
- metrics: every `sluicegate_*` name is registered by `observability/metrics.py`, with the
  suffixes the exposition adds (`_total` and `_created` of counters, `_bucket`, `_sum`,
  `_count` and `_created` of histograms); `sluicegate_cache_*` needs one metric of that
  prefix. `vllm:*` are the engine's own and not checked;
- make targets: every `make X` in code (spans and fenced blocks) is a rule of the Makefile;
- files: every path under one of the tree's top folders (`src/`, `tests/`, `docs/`, ...) and
  every relative link exists, with its `#anchor` if it has one; a glob matches a file; a path
  with a placeholder (`<module>`) is not checked, nor one under a git-ignored output folder
  (`bench/results/`);
- modules: every `name.py` or `package/name.py` outside those folders is a module of
  `src/sluicegate/` (a bare name: a file of that name anywhere), but other projects'
  (`OTHER_PACKAGES`);
- tests: every `test_*.py` named (a bare name: anywhere under `tests/`) exists, and every
  `::test_name` after it is defined in it.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import sluicegate.observability.metrics  # noqa: F401  (registers the metrics)
from sluicegate.models.config import ModelEntry
from sluicegate.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TOP_FOLDERS = ("src", "tests", "docs", "deploy", "bench", "scripts", "docker")

# Prefixes of other programs' variables, which the docs name beside the settings.
OTHER_PROGRAMS = (
    "OTEL_",  # the OpenTelemetry SDK
    "HF_",  # Hugging Face's hub
    "VLLM_",  # vLLM (and the image's build argument VLLM_VERSION)
    "CUDA_",  # the image's base (build argument CUDA_IMAGE)
    "LITELLM_",  # LiteLLM, a benchmark's peer
    "XDG_",  # the XDG base directories
    "PIP_",  # pip
    "SO_",  # socket options
    "FORWARDED_ALLOW_IPS",  # uvicorn
    "GGML_NATIVE",  # llama.cpp's build
    "TRITON_HOME",  # Triton's cache
    "KUBERAY_GEN_RAY_START_CMD",  # KubeRay
    "PROMETHEUS_DISABLE_CREATED_SERIES",  # prometheus_client
)
# The project's own variables that are no setting, and a file that reads each.
PROJECT_VARIABLES = {
    "GATEWAY_CPUS": "docker-compose.yml",
    "GATEWAY_MEMORY": "docker-compose.yml",
    "REDIS_PASSWORD": "docker-compose.yml",
    "GRAFANA_ADMIN_PASSWORD": "docker-compose.yml",
    "PYTEST_ARGS": "Makefile",
    "INTEGRATION_WORKERS": "Makefile",
    "GATEWAY_TEST_BASE_URL": "tests/integration/conftest.py",
}

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_UPPER_SNAKE = re.compile(r"(?<![\w.-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w(-])")
_PREFIXED = re.compile(rf"(?<![\w.-]){ENV_PREFIX}[A-Z0-9_]*[A-Z0-9]")
_REFUSED = re.compile(r"unknown setting\s+$")
_METRIC = re.compile(r"(?<![\w/.-])sluicegate_[a-z0-9_]*[a-z0-9_*]")
# A command: at a span's or a line's start, after a prompt (`$ `), `&&`, `||` or `;`.
_MAKE = re.compile(
    r"(?:^|[;&|]\s*|^\$\s+)make((?:[ \t]+(?:[A-Z_]+=(?:'[^']*'|\"[^\"]*\"|\S*)|[a-z][\w-]*))+)",
    re.M,
)
_RULE = re.compile(r"^([\w][\w .-]*?)\s*::?(?!=)", re.M)
_PATH = re.compile(rf"(?<![\w/.~-])(?:{'|'.join(TOP_FOLDERS)})/[\w./*<>{{}}-]*")
_LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
# A module written as the docs write sluicegate's: `inference/load_limits.py`, `app.py`.
_MODULE = re.compile(r"(?<![\w/.-])((?:[a-z_]\w*/)*[a-z_]\w*\.py)(?![\w/])")
OTHER_PACKAGES = ("vllm/",)  # other projects' modules, named where the docs explain them
# A test module, as a path or a bare name, and what follows it: `::test_name` (a pytest id).
_TEST = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*test_\w+\.py)|::(test_\w+)")


def settings() -> set[str]:
    return {name.upper() for name in Settings.model_fields}


def metrics() -> set[str]:
    """Every series name the registry exposes for sluicegate's metrics."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for family in REGISTRY.collect():
        extra = suffixes.get(family.type, ())
        names |= {family.name, *(family.name + s for s in extra)}
        if family.type == "histogram":
            names.add(family.name + "_created")
    return {name for name in names if name.startswith("sluicegate_")}


def make_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    rules = _RULE.findall(makefile.read_text())
    return {target for rule in rules for target in rule.split() if not target.startswith(".")}


def _outside_fences(text: str) -> str:
    return _FENCE.sub("", text)


def _code(text: str) -> Iterable[str]:
    """The text of code spans and of fenced blocks."""
    yield from _FENCE.findall(text)
    yield from _SPAN.findall(_outside_fences(text))


def wrong_settings(text: str, known: set[str]) -> list[str]:
    """The `UPPER_SNAKE` names of `text` that are no setting and not allow-listed."""
    searched = [(_outside_fences(text), _UPPER_SNAKE)]
    searched += [(fence, _PREFIXED) for fence in _FENCE.findall(text)]
    wrong = []
    for where, pattern in searched:
        for match in pattern.finditer(where):
            name = match.group()
            if _REFUSED.search(where[max(0, match.start() - 40) : match.start()]):
                continue
            if name.startswith(OTHER_PROGRAMS) or name in PROJECT_VARIABLES:
                continue
            if name.removeprefix(ENV_PREFIX) not in known:
                wrong.append(name)
    return wrong


def wrong_metrics(text: str, known: set[str]) -> list[str]:
    wrong = []
    for name in _METRIC.findall(text):
        if name.endswith("*"):
            if not any(metric.startswith(name[:-1]) for metric in known):
                wrong.append(name)
        elif name not in known:
            wrong.append(name)
    return wrong


def wrong_targets(text: str, known: set[str]) -> list[str]:
    wrong = []
    for code in _code(text):
        for words in _MAKE.findall(re.sub(r"#.*", "", code)):
            words = re.sub(r"[A-Z_]+=('[^']*'|\"[^\"]*\"|\S*)", "", words)
            wrong += [word for word in words.split() if word not in known]
    return wrong


def _ignored(root: Path) -> list[str]:
    """The git-ignored folders given as paths (`bench/results/`): what tools write there."""
    lines = (root / ".gitignore").read_text().splitlines()
    return [line for line in lines if "/" in line.rstrip("/") and not line.startswith("#")]


def anchors(text: str) -> set[str]:
    """The `#anchor`s of a page's headings, as GitHub makes them: lower case, punctuation
    dropped, spaces as hyphens, `-1`, `-2` after a repeated one."""
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_outside_fences(text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def wrong_paths(text: str, page: Path, root: Path = ROOT) -> list[str]:
    ignored = _ignored(root)
    wrong = []
    for path in _PATH.findall(text):
        path = path.rstrip(".,")
        if re.search(r"[<>{}]", path) or path.startswith(tuple(ignored)):
            continue
        if not (any(root.glob(path)) if "*" in path else (root / path).exists()):
            wrong.append(path)
    for link, anchor in _LINK.findall(text):
        if re.match(r"[a-z]+:", link) or not (link or anchor):
            continue
        target = page.parent / link if link else page
        if not target.exists():
            wrong.append(link)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
            wrong.append(f"{link}#{anchor}")
    return list(dict.fromkeys(wrong))


@functools.cache
def _file_names(root: Path) -> frozenset[str]:
    """The names of the tree's files, outside virtual environments, caches and `.git`."""
    names: set[str] = set()
    for _folder, folders, files in os.walk(root):
        folders[:] = [f for f in folders if not f.startswith(".") and f not in _NOT_TREE]
        names.update(files)
    return frozenset(names)


_NOT_TREE = {"node_modules", "__pycache__", "build", "dist", "test-artifacts"}


def wrong_modules(text: str, root: Path = ROOT) -> list[str]:
    """Modules that are nowhere: a path is read under `src/sluicegate/` (or the tree's root),
    a bare name may be any file of that name in the tree."""
    source = root / "src" / "sluicegate"
    wrong = []
    for module in _MODULE.findall(text):
        if module.startswith((*OTHER_PACKAGES, *(f"{top}/" for top in TOP_FOLDERS))):
            continue
        if "/" in module:
            found = (source / module).is_file() or (root / module).is_file()
        else:
            found = module in _file_names(root)
        if not found:
            wrong.append(module)
    return wrong


def wrong_tests(text: str, root: Path = ROOT) -> list[str]:
    """Test modules that are nowhere under `tests/`, and `::test_name`s their module (the
    last one named before them) does not define. A bare module name may be any of that name."""
    wrong: list[str] = []
    modules: list[Path] = []
    for path, test in _TEST.findall(text):
        if path:
            found = [root / path] if "/" in path else list((root / "tests").rglob(path))
            modules = [module for module in found if module.is_file()]
            if not modules:
                wrong.append(path)
        elif not modules:
            wrong.append(f"::{test}")
        elif not any(re.search(rf"def {test}\b", m.read_text()) for m in modules):
            wrong.append(f"{modules[0].relative_to(root)}::{test}")
    return wrong


def _check(find: Callable[[Path, str], list[str]], what: str) -> None:
    wrong = [
        f"{page.relative_to(ROOT)}: {name}"
        for page in PAGES
        for name in find(page, page.read_text())
    ]
    assert not wrong, f"the docs name {what} that do not exist:\n" + "\n".join(wrong)


def test_every_setting_named_in_the_docs_is_a_setting() -> None:
    known = settings()
    _check(lambda _, text: wrong_settings(text, known), "settings")


def test_every_metric_named_in_the_docs_is_registered() -> None:
    known = metrics()
    _check(lambda _, text: wrong_metrics(text, known), "metrics")


def test_every_make_target_named_in_the_docs_exists() -> None:
    known = make_targets()
    _check(lambda _, text: wrong_targets(text, known), "make targets")


def test_every_file_named_in_the_docs_is_in_the_tree() -> None:
    _check(lambda page, text: wrong_paths(text, page), "files")


def test_every_module_named_in_the_docs_exists() -> None:
    _check(lambda _, text: wrong_modules(text), "modules")


def test_every_test_named_in_the_docs_exists() -> None:
    _check(lambda _, text: wrong_tests(text), "tests")


def test_the_allow_listed_variables_are_no_settings_and_read_where_the_list_says() -> None:
    known = settings()
    for name, reader in PROJECT_VARIABLES.items():
        assert name not in known, f"{name} is a setting now: take it off PROJECT_VARIABLES"
        assert name in (ROOT / reader).read_text(), f"{reader} does not read {name}"
    for prefix in OTHER_PROGRAMS:
        taken = sorted(name for name in known if name.startswith(prefix))
        assert not taken, f"settings {taken} start with {prefix}, allowed as another program's"


def _settings(text: str) -> list[str]:
    return wrong_settings(text, settings())


def _metrics(text: str) -> list[str]:
    return wrong_metrics(text, metrics())


def _targets(text: str) -> list[str]:
    return wrong_targets(text, make_targets())


def _paths(text: str) -> list[str]:
    return wrong_paths(text, ROOT / "README.md")


def _modules(text: str) -> list[str]:
    return wrong_modules(text)


def _tests(text: str) -> list[str]:
    return wrong_tests(text)


@pytest.mark.parametrize(
    ("find", "good", "planted", "wrong"),
    [
        (_settings, "`MAX_ENGINE_WAITING`", "`MAX_WAITING`", "MAX_WAITING"),
        (
            _settings,
            "SLUICEGATE_MAX_ENGINE_RUNNING",
            "SLUICEGATE_MAX_RUNNING",
            "SLUICEGATE_MAX_RUNNING",
        ),
        (
            _settings,
            "\n```\nSLUICEGATE_PORT=9000 HF_TOKEN=x API_KEY=y\n"
            "unknown setting SLUICEGATE_PROT (did you mean SLUICEGATE_PORT?)\n```\n",
            "\n```\nSLUICEGATE_PROT=9000\n```\n",
            "SLUICEGATE_PROT",
        ),
        (
            _metrics,
            "`sluicegate_requests_total`",
            "`sluicegate_request_total`",
            "sluicegate_request_total",
        ),
        (_metrics, "`sluicegate_cache_*`", "`sluicegate_ghost_*`", "sluicegate_ghost_*"),
        (_targets, "`make test PYTEST_ARGS=-x`", "`make tests`", "tests"),
        (_targets, "\n```\nmake serve\n```\n", "\n```\nmake srve\n```\n", "srve"),
        (_paths, "`src/sluicegate/app.py`", "`src/sluicegate/apps.py`", "src/sluicegate/apps.py"),
        (_paths, "`tests/support/*.py`", "`tests/ghost/*.py`", "tests/ghost/*.py"),
        (_paths, "[the API](docs/api.md)", "[the API](docs/apis.md)", "docs/apis.md"),
        (
            _paths,
            "[limits](docs/operations.md#rate-limits)",
            "[limits](docs/operations.md#rate-limit)",
            "docs/operations.md#rate-limit",
        ),
        (
            _tests,
            "`tests/support/test_docs.py::test_the_layering_diagram_is_the_import_contract`",
            "`test_docs.py::test_the_layering_diagram_is_the_contract`",
            "tests/support/test_docs.py::test_the_layering_diagram_is_the_contract",
        ),
        (_tests, "`test_doc_names.py`", "`test_doc_name.py`", "test_doc_name.py"),
        (_modules, "`inference/load_limits.py`", "`inference/limits.py`", "inference/limits.py"),
        (_modules, "`app.py`", "`apps.py`", "apps.py"),
    ],
    ids=[
        "setting",
        "prefixed-setting",
        "setting-in-a-fence",
        "metric",
        "metric-prefix",
        "make-target",
        "make-target-in-a-fence",
        "path",
        "glob",
        "link",
        "anchor",
        "test",
        "test-module",
        "module",
        "bare-module",
    ],
)
def test_each_check_finds_a_planted_wrong_name(
    find: Callable[[str], list[str]], good: str, planted: str, wrong: str
) -> None:
    """Not vacuous: a real name passes, and a wrong one of each kind beside it is found."""
    assert find(f"Set {good} first.") == []
    assert find(f"Set {good} first, then {planted}.") == [wrong]


def documented_entry_keys(text: str) -> set[str]:
    """The keys of the table under "The models file" in docs/models.md: a row's first cell."""
    match = re.search(r"^## The models file\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "no '## The models file' section"
    rows = re.findall(r"^\| `(\w+)[^`]*` \|", match.group(1), re.M)
    return set(rows)


def test_the_models_file_keys_documented_are_those_the_file_takes() -> None:
    documented = documented_entry_keys((ROOT / "docs" / "models.md").read_text())
    taken = set(ModelEntry.model_fields)
    assert documented == taken, (
        f"docs/models.md's table of an entry's keys lacks {sorted(taken - documented)} "
        f"and names {sorted(documented - taken)}, which models.config.ModelEntry does not take"
    )
