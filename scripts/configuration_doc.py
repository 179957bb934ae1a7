"""Writes the settings table of docs/configuration.md from `Settings`.

The field descriptions in `src/sluicegate/settings/` are the one text; this renders them,
with each variable's default and allowed values, below the marker line of the page (the
prose above it is written by hand). `make docs` runs it with `--write`; a unit test fails
when the page and the settings disagree.

    python scripts/configuration_doc.py [--write]
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from unittest import mock

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sluicegate.settings import ENV_PREFIX, Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
MARKER = (
    "<!-- The table below is generated from Settings by `make docs`; do not edit it by hand. -->"
)
_SECTION = re.compile(r"^\s*# --- (?P<name>[^-]+?) -+\s*$")
_FIELD = re.compile(r"^\s{4}(?P<name>[a-z_][a-z0-9_]*): ")


def sections() -> list[tuple[str, list[str]]]:
    """The settings in declaration order, grouped by the `# --- name ---` comments of the
    concerns' classes (in the order pydantic takes their fields: the last base first)."""
    grouped: list[tuple[str, list[str]]] = []
    for concern in reversed(Settings.__mro__):
        if not concern.__module__.startswith("sluicegate.settings."):
            continue
        for line in inspect.getsource(concern).splitlines():
            if (section := _SECTION.match(line)) is not None:
                grouped.append((section["name"].strip(), []))
            elif (field := _FIELD.match(line)) is not None and field["name"] in vars(concern).get(
                "__annotations__", {}
            ):
                grouped[-1][1].append(field["name"])
    return grouped


def default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        # As for a user with no XDG_CACHE_HOME, whoever renders the page.
        with mock.patch.dict(os.environ, {"HOME": "/HOME"}):
            os.environ.pop("XDG_CACHE_HOME", None)
            value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, Path):
        return f"`{str(value).replace('/HOME', '~', 1)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict) and not value:
        return "`{}`"
    return f"`{value}`"


def allowed(field: FieldInfo) -> str:
    """Allowed values of a Literal, and numeric bounds."""
    annotation = field.annotation
    options = [annotation]
    if get_origin(annotation) is not Literal:  # a union: `X | None`
        options += [a for a in get_args(annotation) if a is not type(None)]
    for option in options:
        if get_origin(option) is Literal:
            return " ".join(f"`{v}`" for v in get_args(option))
    bounds = []
    for meta in field.metadata:
        for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if (value := getattr(meta, name, None)) is not None:
                bounds.append(f"{sign} {value}")
    return ", ".join(bounds)


def render() -> str:
    lines: list[str] = []
    for section, names in sections():
        lines += [f"### {section.capitalize()}", ""]
        lines += ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
        for name in names:
            field = Settings.model_fields[name]
            description = (field.description or "").replace("|", "\\|")
            variable = f"`{ENV_PREFIX}{name.upper()}`"
            lines.append(f"| {variable} | {default(field)} | {allowed(field)} | {description} |")
        lines.append("")
    return "\n".join(lines)


def page(current: str) -> str:
    """`current` with everything after the marker line replaced by the table."""
    head, found, _ = current.partition(MARKER)
    if not found:
        raise SystemExit(f"{PAGE} has no marker line: {MARKER}")
    return f"{head}{MARKER}\n\n{render()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/configuration.md")
    args = parser.parse_args()
    text = page(PAGE.read_text())
    if args.write:
        PAGE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
