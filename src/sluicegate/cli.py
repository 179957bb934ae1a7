"""The `sluicegate` command: `serve` and `model prepare`.

`serve` takes a flag for every setting (`--max-model-len 2048`); a flag beats the
environment, which beats `.env`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sluicegate.settings import ENV_PREFIX, Settings, describe_error

logger = logging.getLogger("sluicegate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluicegate", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the OpenAI-compatible API")
    _add_setting_flags(serve)

    model = commands.add_parser("model", help="model utilities")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    prepare = model_commands.add_parser(
        "prepare", help="convert the bundled SmolLM2 GGUF into a Hugging Face folder (once)"
    )
    prepare.add_argument("--model-cache-dir", default=argparse.SUPPRESS)
    prepare.add_argument("--force", action="store_true", help="convert again")
    return parser


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} [env {ENV_PREFIX}{name.upper()}]"
        if field.annotation in (bool, bool | None):
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(flag, default=argparse.SUPPRESS, help=help_text, metavar="VALUE")


def load_settings(overrides: dict[str, Any]) -> Settings:
    """Settings from flags over the environment; exits with a clear message when invalid."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        print(f"sluicegate: {describe_error(exc)}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    if command == "serve":
        return _serve(args)
    args.pop("model_command")
    return _prepare(args)


def _serve(overrides: dict[str, Any]) -> int:
    from sluicegate.engine.model import ModelError, prepare_bundled_model, resolve_model
    from sluicegate.observability.logs import configure_logging
    from sluicegate.server import serve

    settings = load_settings(overrides)
    configure_logging(settings.log_level, settings.log_format)
    if settings.model is None or Path(settings.model).expanduser().exists():
        # A local model needs no hub; without this, hub look-ups stall on closed networks.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        if settings.model is None:
            prepare_bundled_model(settings.model_cache_dir)
        resolve_model(settings.model, settings.model_cache_dir)
    except ModelError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 1
    return serve(settings)


def _prepare(args: dict[str, Any]) -> int:
    from sluicegate.engine.model import ModelError, prepare_bundled_model
    from sluicegate.observability.logs import configure_logging

    force = args.pop("force")
    settings = load_settings(args)
    configure_logging(settings.log_level, settings.log_format)
    try:
        folder = prepare_bundled_model(settings.model_cache_dir, force=force)
    except ModelError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0
