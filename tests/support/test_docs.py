"""The README's code map and the architecture page's package list stay in step with `src/`,
and the architecture page's layering diagram with the import contract.

Both must name every package (a folder with `__init__.py`, nested ones included) and every
top-level module under `src/sluicegate/`, and neither may name one that no longer exists.
Pure file reads: no import of the gateway.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "sluicegate"
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PYPROJECT = ROOT / "pyproject.toml"

# A name as the docs write one: a module (`cli.py`) or a folder (`api/`, `engine/upstream/`).
_NAME = re.compile(r"(?<![\w/.])((?:[a-z_]\w*/)+|[a-z_]\w*\.py)(?![\w/])")
# In a top-level package's text: one of its own folders, as `upstream/` or `engine/upstream/`.
_SUBFOLDER = r"(?<![\w/.])(?:{parent})?([a-z_]\w*)/(?![\w/])"


def source_names(source: Path = SOURCE) -> set[str]:
    """What the docs must list: `name.py` for each top-level module (but `__init__.py`),
    `name/` (or `parent/name/`) for each package."""
    modules = {path.name for path in source.glob("*.py")} - {"__init__.py"}
    packages = {
        path.parent.relative_to(source).as_posix() + "/"
        for path in source.rglob("__init__.py")
        if path.parent != source and "__pycache__" not in path.parts
    }
    return modules | packages


def section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def readme_entries() -> list[tuple[str, str]]:
    """The code map: the fenced block under "Where to read the code", as (names, text) pairs.
    An entry starts at a line's first column; its names end at the first run of two spaces;
    indented lines continue the entry above."""
    code_map = section(README.read_text(), "Where to read the code")
    block = re.search(r"^```\w*\n(.*?)^```", code_map, re.M | re.S)
    assert block, "no fenced block under '## Where to read the code'"
    entries: list[tuple[str, str]] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            assert entries, f"a continuation line with no entry above it: {line!r}"
            names, text = entries[-1]
            entries[-1] = (names, text + " " + line.strip())
        else:
            names, _, text = line.partition("  ")
            entries.append((names, text.strip()))
    return entries


def architecture_entries() -> list[tuple[str, str]]:
    """The package table under "The packages", as (first cell, the rest of the row) pairs."""
    entries: list[tuple[str, str]] = []
    for line in section(ARCHITECTURE.read_text(), "The packages").splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) < 2 or set(cells[0]) <= {"-", " "} or cells[0].startswith("module"):
            continue
        entries.append((cells[0], " | ".join(cells[1:])))
    return entries


def listed(entries: list[tuple[str, str]]) -> set[str]:
    """The modules and folders an entry list names: top-level ones in the names, and each
    top-level package's own folders (`engine/upstream/`) in its text."""
    names: set[str] = set()
    for head, text in entries:
        found = set(_NAME.findall(head.replace("`", " ")))
        names |= found
        for parent in (name for name in found if name.endswith("/")):
            pattern = _SUBFOLDER.format(parent=re.escape(parent))
            names |= {parent + child + "/" for child in re.findall(pattern, text.replace("`", " "))}
    return names


def check(entries: list[tuple[str, str]], where: str, source: Path = SOURCE) -> None:
    assert entries, f"{where}: no entries found"
    names = listed(entries)
    missing = source_names(source) - names
    assert not missing, f"{where} does not list {sorted(missing)}: add them"
    gone = {name for name in names if not (source / name).exists()}
    assert not gone, f"{where} lists {sorted(gone)}, which src/sluicegate/ no longer has"


def test_the_readme_code_map_lists_every_package_and_top_level_module() -> None:
    check(readme_entries(), "README.md's code map")


def test_the_architecture_page_lists_every_package_and_top_level_module() -> None:
    check(architecture_entries(), "docs/architecture.md's package table")


def _copy_names(source: Path, target: Path) -> None:
    """An empty tree with `source`'s modules, packages and other folders."""
    for path in source.rglob("*"):
        if "__pycache__" in path.parts:
            continue
        copy = target / path.relative_to(source)
        if path.is_dir():
            copy.mkdir(parents=True, exist_ok=True)
        elif path.suffix == ".py":
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.touch()


def test_the_check_fails_on_a_package_added_or_one_listed_that_is_gone(tmp_path: Path) -> None:
    """Not vacuous: a new package or module that the docs do not list, and a listed one
    that does not exist, each fail the check; the real tree copied passes."""
    _copy_names(SOURCE, tmp_path)
    for entries in (readme_entries(), architecture_entries()):
        check(entries, "copy", tmp_path)
        for gone in ("`ghost/`", "`ghost.py`"):
            with pytest.raises(AssertionError, match="no longer has"):
                check([*entries, (gone, "")], "copy", tmp_path)
    (tmp_path / "engine" / "ghost").mkdir()
    (tmp_path / "engine" / "ghost" / "__init__.py").touch()
    with pytest.raises(AssertionError, match=r"does not list \['engine/ghost/'\]"):
        check(readme_entries(), "copy", tmp_path)
    (tmp_path / "ghost.py").touch()
    with pytest.raises(AssertionError, match=r"ghost\.py"):
        check(architecture_entries(), "copy", tmp_path)


def contract_layers() -> list[set[str]]:
    """The `layers` contract of pyproject.toml's import-linter configuration, top to bottom."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [contract["layers"] for contract in contracts if contract["type"] == "layers"]
    return [{name.strip() for name in layer.split("|")} for layer in layers]


def diagram_layers(text: str) -> list[set[str]]:
    """The fenced block under "The layering rule": a layer a line, its names split by `|`."""
    block = re.search(r"^```\w*\n(.*?)^```", section(text, "The layering rule"), re.M | re.S)
    assert block, "no fenced block under '## The layering rule'"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    return [{name.strip() for name in line.split("|")} for line in lines]


def test_the_layering_diagram_is_the_import_contract() -> None:
    drawn, contract = diagram_layers(ARCHITECTURE.read_text()), contract_layers()
    assert drawn == contract, (
        f"docs/architecture.md's layering diagram {drawn} is not pyproject.toml's layers "
        f"contract {contract}: draw it again from the contract, a layer a line"
    )


def test_the_diagram_check_fails_on_a_name_missing_or_out_of_order() -> None:
    text = ARCHITECTURE.read_text()
    assert diagram_layers(text) == contract_layers()
    for wrong in (
        text.replace("\nworker | ports\n", "\n"),
        text.replace("\napp\nwiring\n", "\nwiring\napp\n"),
    ):
        assert diagram_layers(wrong) != contract_layers()
