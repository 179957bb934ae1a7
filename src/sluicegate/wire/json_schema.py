"""Whether a JSON schema sent in a request is one: `response_format` and `structured_outputs`
schemas (`inference.structured`) and tools' `parameters` (`wire.tools`) are checked alike."""

from __future__ import annotations

from typing import Any


def schema_problem(schema: dict[str, Any]) -> str:
    """Why `schema` is not a JSON Schema (by its declared draft, else 2020-12), or ""."""
    import jsonschema
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema.get("$schema", ""), str):
        return "The schema's `$schema` must be a string: the URI of a JSON Schema draft."
    validator: Any = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except RecursionError:
        return "The schema nests too deeply."
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        at = f" at {where}" if where else ""
        return f"The schema is not a valid JSON Schema{at}: {str(exc.message)[:300]}"
    return ""
