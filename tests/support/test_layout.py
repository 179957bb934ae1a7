"""The unit tests mirror the source tree (docs/testing.md#where-the-tests-are): the tests of
`src/sluicegate/<package>/<module>.py` are `tests/unit/<package>/test_<module>.py`, or
`test_<module>_<topic>.py` when one module's tests are split by topic."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "sluicegate"
UNIT = ROOT / "tests" / "unit"


def modules(package: Path) -> set[str]:
    return {
        path.stem if path.is_file() else path.name
        for path in package.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }


def strays() -> list[str]:
    found = []
    for test in sorted(UNIT.rglob("test_*.py")):
        folder = test.parent.relative_to(UNIT)
        package = SOURCE / folder
        name = test.stem.removeprefix("test_")
        names = modules(package) if package.is_dir() else set()
        if not any(name == module or name.startswith(f"{module}_") for module in names):
            found.append(str(test.relative_to(ROOT)))
    return found


def test_every_unit_test_file_is_named_for_the_module_it_tests() -> None:
    assert strays() == []


def test_every_unit_test_folder_is_a_source_package() -> None:
    folders = {p.parent for p in UNIT.rglob("test_*.py")}
    assert all((SOURCE / f.relative_to(UNIT) / "__init__.py").exists() for f in folders)
