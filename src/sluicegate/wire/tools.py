"""Tools a chat request offers the model, and how it may call them.

The request fields (`tools`, `tool_choice`, `parallel_tool_calls`, and the legacy `functions`
and `function_call`) are parsed by the models here; `resolve_tools` checks what needs more
than one field and makes them one `ToolSetup`. For `required` and a named function, the
setup carries the JSON schema that constrains the output (`forced_schema`): the engine then
can only write calls whose arguments validate against the function's parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from sluicegate.errors import InvalidRequestError
from sluicegate.wire.json_schema import schema_problem

FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
"""OpenAI's rule for function names."""
ToolMode = Literal["none", "auto", "required", "named"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, protected_namespaces=())


class FunctionDefinition(_Model):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Model):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Model):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
FunctionCallChoice = Literal["none", "auto"] | FunctionName
"""The legacy `function_call` request field."""


class FunctionCall(_Model):
    """A call as a message carries it: `arguments` is JSON text (OpenAI's wire shape)."""

    name: StrictStr
    arguments: StrictStr


class ToolCall(_Model):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Bounds on the tools one request may offer (`max_tools`, `max_tools_bytes`)."""

    max_tools: int = 128
    max_bytes: int = 64 * 1024
    """Of the tools as JSON, all together: their schemas are compiled into a grammar."""


@dataclass(frozen=True, slots=True)
class ToolSetup:
    """What a request's tool fields come to."""

    tools: tuple[dict[str, Any], ...]
    """The tools as the chat template and tool parsers take them (OpenAI's shape)."""
    mode: ToolMode
    function: str | None = None
    """The forced function's name (mode `named`)."""
    parallel: bool = True
    legacy: bool = False
    """Asked with `functions`: answered with OpenAI's legacy `function_call` (one call)."""
    text: str = ""
    """The tools as JSON: what names them (their schemas' check is remembered by it)."""
    params: tuple[str, ...] = ()
    """Where each tool's `parameters` is in the request (`tools.0.function.parameters`)."""

    def check_schemas(self) -> None:
        """Each tool's `parameters` must be a JSON schema of an object (400 naming it).
        Work proportional to the schemas: run it off the event loop."""
        for tool, param in zip(self.tools, self.params, strict=True):
            check_parameters(tool["function"].get("parameters"), param)

    def choice(self) -> str | dict[str, Any]:
        """`tool_choice` as OpenAI's wire has it, for a server that applies it itself."""
        if self.mode == "named":
            return {"type": "function", "function": {"name": self.function}}
        return self.mode

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    def forced_schema(self) -> str | None:
        """The JSON schema (as text) the output must follow, for `required` and `named`."""
        if self.mode == "named":
            return json.dumps(_parameters(self._tool(self.function)), separators=(",", ":"))
        if self.mode != "required":
            return None
        defs: dict[str, Any] = {}
        calls = []
        for tool in self.tools:
            parameters = dict(_parameters(tool))
            for key in ("$defs", "definitions"):
                # References (`#/$defs/x`) resolve against the document root: hoist them.
                for name, schema in dict(parameters.pop(key, None) or {}).items():
                    ref = f"{key}/{name}"
                    if defs.get(ref, schema) != schema:
                        raise InvalidRequestError(
                            f"Tools define `{key}/{name}` differently; a required tool call "
                            "needs every definition to be the same.",
                            param="tools",
                        )
                    defs[ref] = schema
            calls.append(
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": tool["function"]["name"]},
                        "arguments": parameters,
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
            )
        forced: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            forced["maxItems"] = 1
        for ref, definition in defs.items():
            key, name = ref.split("/", 1)
            forced.setdefault(key, {})[name] = definition
        return json.dumps(forced, separators=(",", ":"))

    def _tool(self, name: str | None) -> dict[str, Any]:
        return next(t for t in self.tools if t["function"]["name"] == name)


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    parameters: dict[str, Any] | None = tool["function"].get("parameters")
    # No parameters still means the arguments are a JSON object.
    return parameters or {"type": "object", "properties": {}}


NO_TOOLS = ToolSetup((), "none")


def resolve_tools(
    tools: list[ToolDefinition] | None,
    tool_choice: ToolChoice | None,
    parallel_tool_calls: bool | None,
    functions: list[FunctionDefinition] | None,
    function_call: FunctionCallChoice | None,
    limits: ToolLimits,
) -> ToolSetup:
    """One `ToolSetup` from the request's tool fields; a 400 naming the field when they do
    not agree. The legacy `functions`/`function_call` mean the same as `tools`/`tool_choice`."""
    if functions is not None:
        if tools is not None:
            raise InvalidRequestError(
                "Send either `tools` or the deprecated `functions`, not both.", param="functions"
            )
        tools = [ToolDefinition(type="function", function=f) for f in functions]
    if function_call is not None:
        if tool_choice is not None:
            raise InvalidRequestError(
                "Send either `tool_choice` or the deprecated `function_call`, not both.",
                param="function_call",
            )
        if isinstance(function_call, FunctionName):
            tool_choice = NamedToolChoice(type="function", function=function_call)
        else:
            tool_choice = function_call
    legacy = functions is not None
    choice_param = "function_call" if function_call is not None else "tool_choice"
    tools_param = "functions" if functions is not None else "tools"
    if not tools:
        if tool_choice is not None:
            raise InvalidRequestError(
                f"'{choice_param}' is only allowed when '{tools_param}' are specified.",
                param=choice_param,
            )
        return NO_TOOLS
    if len(tools) > limits.max_tools:
        raise InvalidRequestError(
            f"At most {limits.max_tools} tools are accepted; this request has {len(tools)}.",
            param=tools_param,
        )
    plain = tuple(t.model_dump(exclude_none=True) for t in tools)
    text = json.dumps(plain, ensure_ascii=False)
    size = len(text)
    if size > limits.max_bytes:
        raise InvalidRequestError(
            f"The tools take {size} characters as JSON; at most {limits.max_bytes} are accepted.",
            param=tools_param,
        )
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidRequestError(
            "The tools hold text that is not valid Unicode (a lone UTF-16 surrogate).",
            param=tools_param,
        ) from None
    seen: set[str] = set()
    params = []
    for i, tool in enumerate(tools):
        name = tool.function.name
        where = f"{tools_param}.{i}" + (".function" if tools_param == "tools" else "")
        if name in seen:
            raise InvalidRequestError(
                f"Function names must be unique; `{name}` is given twice.", param=f"{where}.name"
            )
        seen.add(name)
        params.append(f"{where}.parameters")
    parallel, where_params = parallel_tool_calls is not False, tuple(params)
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        if name not in seen:
            raise InvalidRequestError(
                f"The function `{name}` named in '{choice_param}' is not among the "
                f"'{tools_param}'.",
                param=choice_param,
            )
        return ToolSetup(plain, "named", name, parallel, legacy, text, where_params)
    mode: ToolMode = tool_choice or "auto"
    return ToolSetup(plain, mode, None, parallel, legacy, text, where_params)


def check_parameters(parameters: dict[str, Any] | None, param: str) -> None:
    """A function's `parameters` must be a JSON schema describing an object."""
    if parameters is None:
        return
    kind = parameters.get("type", "object")
    if kind != "object":
        raise InvalidRequestError(
            f"Function parameters must be a JSON schema of an object (type 'object'), "
            f"not of type {json.dumps(kind)}.",
            param=param,
        )
    if problem := schema_problem(parameters):
        raise InvalidRequestError(f"Function parameters: {problem}", param=param)
