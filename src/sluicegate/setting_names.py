"""The `SLUICEGATE_*` names given that are no setting: a mistyped one (`..._PROT=9000` for
`PORT`) would otherwise be ignored, and the gateway start without what the operator meant.

`serve` and `model prepare` look through the environment and the `.env` file before anything
starts (`cli.load_settings`): each unknown name stops start-up with a line naming it and the
closest real setting, or is only warned of under `ALLOW_UNKNOWN_SETTINGS`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values

from sluicegate.settings import ENV_PREFIX, Settings


@dataclass(frozen=True)
class UnknownSetting:
    name: str
    """As it was given (upper-cased: the environment's names are read without case)."""
    where: str
    """`the environment`, or the `.env` file's path."""
    closest: str | None
    """The real setting's variable it is most like, if any is alike enough."""

    def __str__(self) -> str:
        hint = f" (did you mean {self.closest}?)" if self.closest else ""
        return f"unknown setting {self.name} in {self.where}{hint}"


def unknown_settings(
    environ: Mapping[str, str], dotenv: Path | None = None
) -> list[UnknownSetting]:
    """Each `SLUICEGATE_*` name of `environ` and of the `dotenv` file that is no setting."""
    found = [UnknownSetting(n, "the environment", closest(n)) for n in _unknown(environ)]
    if dotenv is not None and dotenv.is_file():
        keys = [key for key in dotenv_values(dotenv) if key]
        found += [UnknownSetting(n, str(dotenv), closest(n)) for n in _unknown(keys)]
    return found


def dotenv_file() -> Path | None:
    """The `.env` file the settings read (`Settings.model_config`), where they look for it."""
    configured = Settings.model_config.get("env_file")
    return Path(configured) if isinstance(configured, (str, Path)) else None


def closest(name: str) -> str | None:
    """The setting's variable most like `name` (compared without the common prefix)."""
    wanted = name.upper().removeprefix(ENV_PREFIX)
    known = [field.upper() for field in Settings.model_fields]
    match = difflib.get_close_matches(wanted, known, n=1, cutoff=0.6)
    return ENV_PREFIX + match[0] if match else None


def _unknown(names: Iterable[str]) -> list[str]:
    known = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    given = (name.upper() for name in names)
    return sorted({name for name in given if name.startswith(ENV_PREFIX) and name not in known})
