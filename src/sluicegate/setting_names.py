"""The `SLUICEGATE_*` names given that are no setting: a mistyped one (`..._PROT=9000` for
`PORT`) would otherwise be ignored, and the gateway start without what the operator meant.

`serve` and `model prepare` look through the environment and the `.env` file before anything
starts (`cli.load_settings`): each unknown name stops start-up with a line naming it and the
closest real setting, or is only warned of under `ALLOW_UNKNOWN_SETTINGS`.
"""

from __future__ import annotations

import difflib
import re
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
    names = [name for name, value in environ.items() if not is_service_link(name, value)]
    found = [UnknownSetting(n, "the environment", closest(n)) for n in _unknown(names)]
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


_SERVICE_LINK = re.compile(
    r"[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)"
)
_SERVICE_ADDRESS = re.compile(r"(tcp|udp|sctp)://")


def is_service_link(name: str, value: str) -> bool:
    """Whether the variable is one Kubernetes puts in every container for each Service of its
    namespace (unless the pod says `enableServiceLinks: false`): a Service named `sluicegate`
    gives `SLUICEGATE_SERVICE_HOST`, `SLUICEGATE_PORT=tcp://...`, `SLUICEGATE_PORT_8000_TCP`
    and more, and one named `sluicegate-redis` `SLUICEGATE_REDIS_PORT=tcp://...`. They are no
    typo of the operator's, so they never stop start-up. A real setting's name is still read
    as that setting."""
    upper = name.upper()
    if _SERVICE_LINK.fullmatch(upper):
        return True
    return upper.endswith("_PORT") and _SERVICE_ADDRESS.match(value) is not None


def _unknown(names: Iterable[str]) -> list[str]:
    known = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    given = (name.upper() for name in names)
    return sorted({name for name in given if name.startswith(ENV_PREFIX) and name not in known})
