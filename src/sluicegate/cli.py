"""The `sluicegate` command: `serve`, `model prepare`, `profile` (traffic profiles) and `tune`.

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
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sluicegate.setting_names import dotenv_file, unknown_settings
from sluicegate.settings import ENV_PREFIX, Settings, describe_error

if TYPE_CHECKING:
    from sluicegate.models.config import ModelEntry

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
    from sluicegate.tuning.command import add_profile_commands, add_tune_command

    add_profile_commands(commands)
    add_tune_command(commands)
    return parser


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        # argparse formats help with %: a literal one (a "20%" in a description) is doubled.
        help_text = f"{field.description} [env {ENV_PREFIX}{name.upper()}]".replace("%", "%%")
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
    """Settings from flags over the environment; exits with a clear message when invalid,
    or when a `SLUICEGATE_*` name given is no setting (unless ALLOW_UNKNOWN_SETTINGS)."""
    unknown = unknown_settings(os.environ, dotenv_file())
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for line in [describe_error(exc), *map(str, unknown)]:
            print(f"sluicegate: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    if unknown and not settings.allow_unknown_settings:
        for name in unknown:
            print(f"sluicegate: {name}", file=sys.stderr)
        print(
            f"sluicegate: unset or correct it ({ENV_PREFIX}ALLOW_UNKNOWN_SETTINGS=true starts "
            "anyway)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    for name in unknown:
        print(f"sluicegate: warning: {name}: ignored", file=sys.stderr)
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    if command == "serve":
        return _serve(args)
    if command == "profile":
        from sluicegate.tuning.command import run_profile

        return run_profile(args)
    if command == "tune":
        from sluicegate.tuning.command import run_tune_command

        return run_tune_command(args)
    args.pop("model_command")
    return _prepare(args)


def _serve(overrides: dict[str, Any]) -> int:
    from sluicegate.observability.logs import configure_logging
    from sluicegate.ports import PortError, hold_port
    from sluicegate.wiring.entries import uses_local_engine

    settings = load_settings(overrides)
    configure_logging(settings.log_level, settings.log_format)
    if hub_offline(settings):
        # A local model needs no hub; without this, hub look-ups stall on closed networks.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        # First: a port in use stops start-up before a model is prepared or an engine starts.
        port = hold_port(settings)
    except PortError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 1
    try:
        _check_capture(settings)
        entries = _model_entries(settings)
        _prepare_engine_models(settings, uses_local_engine(entries))
        _check_upstream_install(settings, entries)
        if settings.workers > 1:
            from sluicegate.supervisor import supervise

            return supervise(settings, port)
        from sluicegate.server import serve

        return serve(settings, sock=port.sock)
    except ServeError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 1
    finally:
        port.close()


def _model_entries(settings: Settings) -> list[ModelEntry]:
    """What the gateway will serve, read (and the models file checked) before anything
    starts: a bad registry stops start-up with one line naming the entry."""
    from sluicegate.wiring.entries import ModelsError, model_entries

    try:
        return model_entries(settings)
    except ModelsError as exc:
        raise ServeError(str(exc)) from None


def _check_capture(settings: Settings) -> None:
    """A capture file that exists (or has no folder) stops start-up before any model loads."""
    from sluicegate.wiring.capture import CaptureFileError, check_capture_file

    try:
        check_capture_file(settings.traffic_capture)
    except CaptureFileError as exc:
        raise ServeError(str(exc)) from None


def hub_offline(settings: Settings) -> bool:
    """Whether `serve` keeps Hugging Face's hub offline: only when the in-process engine alone
    serves, a local model (the bundled one, or a folder). Upstreams load no model, and their
    tokenizers may be hub ids (`HF_HUB_OFFLINE=1` from the environment still holds)."""
    if settings.upstreams or settings.models_file is not None:
        return False
    return settings.model is None or Path(settings.model).expanduser().exists()


class ServeError(Exception):
    """`serve` cannot start; the message is one line meant for the operator."""


def _check_upstream_install(settings: Settings, entries: list[ModelEntry]) -> None:
    """Upstreams need no engine; a local or hub tokenizer needs the `tokenizer` extra."""
    wants = [e.name for e in entries if e.tokenizer is not None]
    if settings.upstreams and settings.tokenizer is not None:
        wants.append("SLUICEGATE_TOKENIZER")
    if wants and not _installed("transformers", "jinja2"):
        raise ServeError(
            f"a tokenizer ({', '.join(wants)}) needs transformers and jinja2, which are not "
            "installed: pip install 'sluicegate[tokenizer]' (or leave it unset to count with "
            "the upstream's /tokenize)"
        )


def _prepare_engine_models(settings: Settings, generative: bool) -> None:
    """The in-process engines' models, prepared (the bundled one, once) and checked: the
    generative engine's when it runs, the embedding engine's when one is set."""
    from sluicegate.engine.model import ModelError, prepare_bundled_model, resolve_model

    embedding = settings.embedding_model
    if not generative and embedding is None:
        return
    if not _installed("vllm"):
        raise ServeError(
            "the in-process engine needs vLLM, which is not installed: pip install "
            "'sluicegate[cpu]' or 'sluicegate[gpu]', or set SLUICEGATE_UPSTREAM_URLS to serve "
            "through remote OpenAI-compatible servers"
        )
    wanted: list[str | None] = []
    if generative:
        wanted.append(settings.model)
    if embedding is not None:
        wanted.append(None if embedding == "bundled" else embedding)
    try:
        for model in wanted:
            if model is None:
                prepare_bundled_model(settings.model_cache_dir)
            resolve_model(model, settings.model_cache_dir)
    except ModelError as exc:
        raise ServeError(str(exc)) from None


def _installed(*modules: str) -> bool:
    """Whether the modules can be imported, found without importing them (vLLM takes
    seconds)."""
    from importlib.util import find_spec

    return all(find_spec(module) is not None for module in modules)


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
