"""Tool input schemas (JSON Schema) and the validation every call goes through."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["field", "numeric_field", "object_schema", "validate_input"]

# Models often send numbers as strings ("10"); such fields accept a string of digits too.
_NUMERAL = {
    "integer": r"^\s*[-+]?\d+\s*$",
    "number": r"^\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)\s*$",
}

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


def field(kind: str | list[str], description: str, **extra: Any) -> dict[str, Any]:
    """One property: ``field("integer", "Line to start at", minimum=1)``."""
    return {"type": kind, "description": description, **extra}


def numeric_field(kind: str, description: str, *, nullable: bool = True, **extra: Any) -> dict[str, Any]:
    """A number (``kind`` ``"integer"`` or ``"number"``) that may also come as a numeric string,
    which validation converts: ``numeric_field("number", "Seconds")`` accepts ``10`` and ``"10"``."""
    kinds = [kind, "string", "null"] if nullable else [kind, "string"]
    return {"type": kinds, "pattern": _NUMERAL[kind], "description": description, **extra}


def object_schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    """A closed object schema (no additional properties)."""
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False  # JSON true is not a number
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PY_TYPES[kind])


def validate_input(tool: str, schema: dict[str, Any], data: Any) -> dict[str, Any]:
    """Check ``data`` against ``schema`` and return it with defaults filled in.

    Raises
    ------
    ValueError
        Naming the tool and the field: not an object, unknown field, missing required field,
        wrong type, value not allowed, number below its minimum.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{tool}: input must be an object, got {type(data).__name__}")
    properties: dict[str, dict[str, Any]] = schema["properties"]
    for key in data:
        if key not in properties:
            raise ValueError(f"{tool}: unknown field {key!r} (expected one of: {', '.join(properties)})")
    out: dict[str, Any] = {}
    for key, spec in properties.items():
        if key not in data or (data[key] is None and "null" not in _kinds(spec)):
            if key in schema.get("required", ()):
                raise ValueError(f"{tool}: missing required field {key!r}")
            if "default" in spec:
                out[key] = spec["default"]
            continue
        value = data[key]
        kinds = _kinds(spec)
        if not any(_type_ok(value, k) for k in kinds):
            raise ValueError(f"{tool}: field {key!r} must be {' or '.join(kinds)}, got {type(value).__name__}")
        if isinstance(value, str) and "pattern" in spec and not re.search(spec["pattern"], value):
            if spec["pattern"] == _NUMERAL["integer"]:
                expected = "an integer or a string of digits"
            elif spec["pattern"] == _NUMERAL["number"]:
                expected = "a number or a numeric string"
            else:
                expected = f"a string matching {spec['pattern']}"
            raise ValueError(f"{tool}: field {key!r} must be {expected}, got {value!r}")
        if isinstance(value, str) and spec.get("pattern") in _NUMERAL.values():
            text = value.strip()
            value = int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)
        if isinstance(value, float) and "integer" in kinds and value.is_integer():
            value = int(value)
        if "enum" in spec and value not in spec["enum"] and value is not None:
            allowed = ", ".join(repr(v) for v in spec["enum"])
            raise ValueError(f"{tool}: field {key!r} must be one of {allowed}, got {value!r}")
        if "minimum" in spec and isinstance(value, (int, float)) and value < spec["minimum"]:
            raise ValueError(f"{tool}: field {key!r} must be at least {spec['minimum']}, got {value}")
        items = spec.get("items")
        if items and isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                if not any(_type_ok(item, k) for k in _kinds(items)):
                    raise ValueError(f"{tool}: field {key!r}[{index}] must be {' or '.join(_kinds(items))}")
        out[key] = value
    return out


def _kinds(spec: dict[str, Any]) -> list[str]:
    kind = spec.get("type", [])
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return kind
    return [k["type"] for k in spec.get("anyOf", []) if "type" in k]
