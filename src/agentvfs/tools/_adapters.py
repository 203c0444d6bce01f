"""Tool definitions for model APIs: OpenAI function calling in strict mode."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from ._core import WorkspaceTool

__all__ = ["openai_tools", "strict_json_schema"]

#: Keywords OpenAI's strict mode accepts in a schema; everything else is left out.
_STRICT_KEYWORDS = frozenset(
    {"type", "description", "title", "enum", "const", "properties", "required", "additionalProperties", "items", "anyOf", "$defs", "$ref"}
)
#: Constraints strict mode rejects (or not on every model): told to the model in the
#: description instead. The tool still enforces them when it runs.
_DESCRIBED = ("default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems")


def _with_null(schema: dict[str, Any]) -> dict[str, Any]:
    """Let ``schema`` also accept null (a strict model's way to leave a field out)."""
    if "anyOf" in schema:
        if not any(branch.get("type") == "null" for branch in schema["anyOf"]):
            schema["anyOf"] = [*schema["anyOf"], {"type": "null"}]
        return schema
    kind = schema.get("type")
    if isinstance(kind, str) and kind != "null":
        schema["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        schema["type"] = [*kind, "null"]
    if "enum" in schema and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    return schema


def _note(schema: Mapping[str, Any]) -> str:
    parts = [f"{key}: {json.dumps(schema[key])}" for key in _DESCRIBED if key in schema]
    return f"({'; '.join(parts)})" if parts else ""


def _strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else list(kind) if isinstance(kind, list) else []
    concrete = [k for k in kinds if k != "null"]
    note = _note(schema)
    described = " ".join(part for part in (schema.get("description"), note) if part)
    if len(concrete) > 1:
        # A union such as ["string", "array"]: one anyOf branch per type, each strict.
        branches: list[dict[str, Any]] = []
        for k in concrete:
            branch: dict[str, Any] = {"type": k}
            if k == "array" and "items" in schema:
                branch["items"] = schema["items"]
            if k == "object":
                branch.update({key: schema[key] for key in ("properties", "required") if key in schema})
            branches.append(_strict(branch))
        if "null" in kinds:
            branches.append({"type": "null"})
        union: dict[str, Any] = {"anyOf": branches}
        if described:
            union["description"] = described
        return union
    out = {key: copy.deepcopy(value) for key, value in schema.items() if key in _STRICT_KEYWORDS}
    if described:
        out["description"] = described
    if "anyOf" in schema:
        out["anyOf"] = [_strict(branch) for branch in schema["anyOf"]]
    if isinstance(schema.get("items"), Mapping):
        out["items"] = _strict(schema["items"])
    if "$defs" in schema:
        out["$defs"] = {name: _strict(sub) for name, sub in schema["$defs"].items()}
    if "object" in kinds or "properties" in schema:
        required = set(schema.get("required", ()))
        properties: dict[str, Any] = {}
        for name, sub in (schema.get("properties") or {}).items():
            prop = _strict(sub)
            properties[name] = prop if name in required else _with_null(prop)
        out["properties"] = properties
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return out


def strict_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite a tool's input schema for OpenAI strict mode (the input is not changed).

    Every object is closed (``additionalProperties: false``) and lists all its properties in
    ``required``; a property that was optional becomes nullable (``null`` means "not given",
    which :meth:`WorkspaceTool.execute` accepts). Keywords strict mode does not take, such as
    ``default`` and ``minimum``, move into the property's description. A type union such as
    ``["string", "array"]`` becomes ``anyOf``.
    """
    return _strict(schema)


def openai_tools(tools: Mapping[str, WorkspaceTool]) -> list[dict[str, Any]]:
    """The tools as OpenAI function-calling definitions, in strict mode.

    Parameters
    ----------
    tools : Mapping[str, WorkspaceTool]
        What ``await workspace.create_tools()`` returns.

    Returns
    -------
    list of dict
        ``{"type": "function", "function": {"name", "description", "parameters", "strict": True}}``
        per tool, in the mapping's order. The model answers with JSON arguments that
        ``tools[name].execute(json.loads(arguments))`` takes as they are, nulls included.
    """
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": strict_json_schema(tool.input_schema),
                "strict": True,
            },
        }
        for tool in tools.values()
    ]
