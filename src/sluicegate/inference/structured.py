"""Structured outputs: from a request's `response_format` or `structured_outputs` to the
engine's `StructuredOutput`, within bounds, checked before any work is admitted.

Two steps, so that nothing long runs on the event loop:

- `requested_constraint` (inline, cheap): which constraint the request asks for, its size
  and nesting bounded by walks that stop at the limit (so their cost follows the limit, not
  the body), and a JSON schema as canonical text (sorted keys, compact separators), so equal
  schemas give equal cache keys.
- `ConstraintCheck.check` (in a worker thread, memoized): the schema is a JSON Schema
  (`jsonschema`), and the engine's grammar backend accepts the constraint (vLLM's own
  validation, `EngineClient.check_structured`). vLLM validates again when the request reaches
  it, on the event loop; the size bounds keep that short, and this check makes anything it
  would refuse a 400 naming the parameter before the request is admitted or looked up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from sluicegate.engine.protocol import StructuredOutput
from sluicegate.errors import InvalidRequestError
from sluicegate.lru import BoundedLRU
from sluicegate.wire.json_schema import schema_problem
from sluicegate.wire.requests import SamplingRequest
from sluicegate.wire.tools import ToolSetup

Kind = Literal["json_schema", "json_object", "regex", "choice", "grammar", "tool_call"]
KINDS: tuple[Kind, ...] = ("json_schema", "json_object", "regex", "choice", "grammar", "tool_call")
"""`tool_call`: the schema of `tool_choice` "required" or a named function (`wire.tools`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StructuredLimits:
    """Bounds on one request's constraint; each breach is a 400 naming the parameter."""

    max_schema_bytes: int = 32 * 1024
    """Canonical JSON text of a schema, in bytes."""
    max_schema_depth: int = 32
    """Nested objects and arrays of a schema document (vLLM refuses beyond 64)."""
    max_regex_length: int = 4096
    max_grammar_bytes: int = 32 * 1024
    max_choices: int = 256
    max_choice_length: int = 1024
    compact_whitespace: bool = True
    """The grammar allows no free whitespace in JSON (the engine's setting, repeated here so
    that it is part of every constraint and of its cache key)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Requested:
    """The constraint a request asks for, and where in the request it came from."""

    output: StructuredOutput
    kind: Kind
    param: str
    """The parameter to name when the constraint is refused (`structured_outputs.json`)."""
    schema: dict[str, Any] | None = None
    """The parsed schema, for JSON Schema checking (`json_schema` only)."""


def requested_constraint(request: SamplingRequest, limits: StructuredLimits) -> Requested | None:
    """The request's constraint, bounded and canonical; None when it asks for none."""
    fmt = request.response_format
    extension = request.structured_outputs
    if fmt is not None and fmt.type != "text" and extension is not None:
        raise InvalidRequestError(
            "Set either response_format or structured_outputs, not both.",
            param="structured_outputs",
        )
    compact = limits.compact_whitespace
    if fmt is not None and fmt.type == "json_object":
        return Requested(
            StructuredOutput(json_object=True, compact_whitespace=compact),
            "json_object",
            "response_format",
        )
    if fmt is not None and fmt.type == "json_schema":
        assert fmt.json_schema is not None  # the wire model requires it
        param = "response_format.json_schema.schema"
        schema = fmt.json_schema.schema_
        if schema is None:
            # OpenAI's schema is optional; without one, any JSON object.
            return Requested(
                StructuredOutput(json_object=True, compact_whitespace=compact), "json_object", param
            )
        return _schema(schema, param, limits)
    if extension is None:
        return None
    if extension.disable_any_whitespace is not None and extension.disable_any_whitespace != compact:
        raise InvalidRequestError(
            f"structured_outputs.disable_any_whitespace is a server setting here "
            f"(SLUICEGATE_STRUCTURED_COMPACT_WHITESPACE={str(compact).lower()}).",
            param="structured_outputs.disable_any_whitespace",
        )
    if extension.json_ is not None:
        return _schema(extension.json_, "structured_outputs.json", limits)
    if extension.json_object:
        return Requested(
            StructuredOutput(json_object=True, compact_whitespace=compact),
            "json_object",
            "structured_outputs.json_object",
        )
    if extension.regex is not None:
        param = "structured_outputs.regex"
        if len(extension.regex) > limits.max_regex_length:
            raise InvalidRequestError(
                f"The regex must be at most {limits.max_regex_length} characters long.",
                param=param,
            )
        return Requested(
            StructuredOutput(regex=extension.regex, compact_whitespace=compact), "regex", param
        )
    if extension.grammar is not None:
        param = "structured_outputs.grammar"
        if len(extension.grammar) > limits.max_grammar_bytes or (
            len(extension.grammar.encode()) > limits.max_grammar_bytes
        ):
            raise InvalidRequestError(
                f"The grammar must be at most {limits.max_grammar_bytes} bytes long.",
                param=param,
            )
        if not extension.grammar.strip():
            raise InvalidRequestError("The grammar must not be empty.", param=param)
        return Requested(
            StructuredOutput(grammar=extension.grammar, compact_whitespace=compact),
            "grammar",
            param,
        )
    choices = extension.choice or []
    param = "structured_outputs.choice"
    if not choices:
        raise InvalidRequestError("choice must hold at least one string.", param=param)
    if len(choices) > limits.max_choices:
        raise InvalidRequestError(
            f"At most {limits.max_choices} choices are accepted.", param=param
        )
    if any(len(c) > limits.max_choice_length for c in choices):
        raise InvalidRequestError(
            f"Each choice must be at most {limits.max_choice_length} characters long.",
            param=param,
        )
    return Requested(
        StructuredOutput(choice=tuple(choices), compact_whitespace=compact), "choice", param
    )


def _schema(value: dict[str, Any] | str, param: str, limits: StructuredLimits) -> Requested:
    if isinstance(value, str):
        # vLLM's clients may send the schema as JSON text.
        if len(value) > limits.max_schema_bytes:
            raise _too_large(param, limits)
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequestError(
                f"The schema is not valid JSON: {exc}.", param=param
            ) from None
        if not isinstance(value, dict):
            raise InvalidRequestError("The schema must be a JSON object.", param=param)
    if not _within(value, limits.max_schema_depth, limits.max_schema_bytes):
        # Which bound was passed: depth is checked alone (bytes walk the same nodes).
        if not _within(value, limits.max_schema_depth, None):
            raise InvalidRequestError(
                f"The schema nests objects and arrays more than {limits.max_schema_depth} "
                "levels deep.",
                param=param,
            )
        raise _too_large(param, limits)
    # ASCII only: a lone surrogate inside a string becomes an escape the checks refuse,
    # instead of text that cannot be encoded.
    text = json.dumps(canonical(value), separators=(",", ":"), ensure_ascii=True)
    if len(text) > limits.max_schema_bytes:
        raise _too_large(param, limits)
    output = StructuredOutput(json=text, compact_whitespace=limits.compact_whitespace)
    return Requested(output, "json_schema", param, value)


def forced_tool_call(schema: str, limits: StructuredLimits) -> Requested:
    """The constraint of `tool_choice` "required" or a named function (`ToolSetup.
    forced_schema`), bounded, canonical and checked like a requested schema; refusals name
    `tools`."""
    return dataclasses.replace(_schema(json.loads(schema), "tools", limits), kind="tool_call")


def canonical(schema: Any) -> Any:
    """`schema` with the keys of every object sorted, except the members of `properties`: the
    grammar generates an object's properties in that order (as OpenAI's models do), so it is
    part of what the schema asks for (a `reasoning` field before an `answer` one)."""
    return _canonical(schema, keep_order=False)


def _canonical(node: Any, keep_order: bool) -> Any:
    if isinstance(node, dict):
        keys = list(node) if keep_order else sorted(node)
        # A schema's `properties` is a map of names to schemas: its order is kept; every
        # other object (schemas, `$defs`, `const` and `enum` values) is sorted.
        return {
            k: _canonical(node[k], keep_order=not keep_order and k == "properties") for k in keys
        }
    if isinstance(node, list):
        return [_canonical(item, keep_order=False) for item in node]
    return node


def _too_large(param: str, limits: StructuredLimits) -> InvalidRequestError:
    return InvalidRequestError(
        f"The schema must be at most {limits.max_schema_bytes} bytes as compact JSON.",
        param=param,
    )


def _within(value: Any, max_depth: int, max_bytes: int | None) -> bool:
    """Whether `value` nests at most `max_depth` containers and would take about at most
    `max_bytes` as compact JSON (a lower estimate). Stops at the first breach, so its cost
    follows the limits, not the value."""
    budget = max_bytes if max_bytes is not None else -1
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > max_depth:
                return False
            budget -= 2 + len(node)
            for key, item in node.items():
                budget -= len(key) + 3
                stack.append((item, depth + 1))
        elif isinstance(node, list):
            if depth > max_depth:
                return False
            budget -= 2 + len(node)
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, str):
            budget -= len(node) + 2
        else:
            budget -= 1
        if max_bytes is not None and budget < 0:
            return False
    return True


TOOL_MEMO_CHARS = 8 * 1024 * 1024
"""The remembered tool sets' JSON, all together."""
Checker = Callable[[StructuredOutput], Awaitable[None]]
"""The engine's own check of a constraint (`EngineClient.check_structured`)."""


class ConstraintCheck:
    """Checks constraints off the event loop, remembering the verdict on recent ones (the
    same schema sent again costs a dictionary lookup)."""

    def __init__(self, engine_check: Checker, memo_entries: int = 256) -> None:
        self._engine_check = engine_check
        self._verdicts: BoundedLRU[StructuredOutput, str] = BoundedLRU(memo_entries)
        self._tool_verdicts: BoundedLRU[str, tuple[str, str | None]] = BoundedLRU(
            memo_entries, TOOL_MEMO_CHARS
        )

    async def check(self, requested: Requested) -> float:
        """Raise `InvalidRequestError` naming `requested.param` if the constraint is refused.
        Returns the seconds the check took (0 when remembered)."""
        verdict = self._verdicts.get(requested.output)
        started = time.perf_counter()
        if verdict is None:
            verdict = await self._verdict(requested)
            self._verdicts.put(requested.output, verdict)
            elapsed = time.perf_counter() - started
        else:
            elapsed = 0.0
        if verdict:
            raise InvalidRequestError(verdict, param=requested.param)
        return elapsed

    async def check_tools(self, tools: ToolSetup) -> None:
        """Check the tools' parameter schemas in a worker thread (their size is bounded by
        `max_tools_bytes`, not small), remembering the verdict by the tools' JSON: agents
        send the same tools every turn."""
        if not tools.tools:
            return
        verdict = self._tool_verdicts.get(tools.text)
        if verdict is None:
            try:
                await asyncio.to_thread(tools.check_schemas)
                verdict = ("", None)
            except InvalidRequestError as exc:
                verdict = (exc.message, exc.param)
            self._tool_verdicts.put(tools.text, verdict, len(tools.text))
        if verdict[0]:
            raise InvalidRequestError(verdict[0], param=verdict[1])

    async def _verdict(self, requested: Requested) -> str:
        """ "" when accepted, else why not."""
        if requested.schema is not None:
            problem = await asyncio.to_thread(schema_problem, requested.schema)
            if problem:
                return problem
        try:
            await self._engine_check(requested.output)
        except InvalidRequestError as exc:
            return exc.message
        return ""
