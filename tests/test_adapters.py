"""``openai_tools``: strict function-calling schemas, and tools that take what a strict model sends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentvfs import WORKSPACE_TOOLS, LocalFilesystem, Workspace, WorkspaceTool
from agentvfs.tools import openai_tools
from agentvfs.tools._adapters import strict_json_schema

pytestmark = pytest.mark.anyio
FS = WORKSPACE_TOOLS.FILESYSTEM
#: The keywords OpenAI's strict mode takes (structured outputs' supported subset).
STRICT_KEYWORDS = {"type", "description", "title", "enum", "const", "properties", "required", "additionalProperties", "items", "anyOf", "$defs", "$ref"}
STRICT_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}


def check_strict(schema: dict[str, Any], where: str = "parameters") -> None:
    """Assert ``schema`` keeps OpenAI's strict-mode rules, all the way down."""
    assert set(schema) <= STRICT_KEYWORDS, f"{where}: {set(schema) - STRICT_KEYWORDS}"
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    assert set(kinds) <= STRICT_TYPES, where
    assert len([k for k in kinds if k != "null"]) <= 1, f"{where}: a type union must be anyOf"
    if "anyOf" in schema:
        assert "type" not in schema, where
        for index, branch in enumerate(schema["anyOf"]):
            check_strict(branch, f"{where}.anyOf[{index}]")
    if "enum" in schema and "null" in kinds:
        assert None in schema["enum"], f"{where}: a nullable enum lists null"
    if "object" in kinds:
        assert schema["additionalProperties"] is False, where
        assert schema["required"] == list(schema["properties"]), where
        for name, sub in schema["properties"].items():
            check_strict(sub, f"{where}.{name}")
    if "items" in schema:
        check_strict(schema["items"], f"{where}[]")


def nullable(schema: dict[str, Any]) -> bool:
    if "anyOf" in schema:
        return any(branch.get("type") == "null" for branch in schema["anyOf"])
    kinds = schema["type"]
    return isinstance(kinds, list) and "null" in kinds


@pytest.fixture
async def tools(tmp_path: Path) -> dict[str, WorkspaceTool]:
    (tmp_path / "a.txt").write_bytes(b"Hello World\nsecond line\n")
    return await Workspace(filesystem=LocalFilesystem(tmp_path)).create_tools()


async def test_every_tool_has_a_strict_function_schema(tools: dict[str, WorkspaceTool]) -> None:
    defs = openai_tools(tools)
    assert [d["function"]["name"] for d in defs] == list(tools)
    for definition, tool in zip(defs, tools.values(), strict=True):
        assert definition["type"] == "function"
        function = definition["function"]
        assert set(function) == {"name", "description", "parameters", "strict"}
        assert function["strict"] is True and function["description"] == tool.description
        parameters = function["parameters"]
        assert parameters["type"] == "object"  # the root is a plain object, never nullable
        check_strict(parameters)
        assert list(parameters["properties"]) == list(tool.input_schema["properties"])
        for name, prop in parameters["properties"].items():
            assert nullable(prop) is (name not in tool.input_schema["required"]), (tool.name, name)
        json.dumps(definition)  # plain JSON
    # The tool's own schema is left as it was.
    assert tools[FS.READ_FILE].input_schema["required"] == ["path"]
    assert tools[FS.READ_FILE].input_schema["properties"]["showLineNumbers"]["default"] is True


async def test_schema_details(tools: dict[str, WorkspaceTool]) -> None:
    params = {d["function"]["name"]: d["function"]["parameters"] for d in openai_tools(tools)}
    read = params[FS.READ_FILE]["properties"]
    assert read["path"] == {"type": "string", "description": 'Path relative to the workspace root, e.g. "data/config.json"'}
    assert read["offset"] == {"type": ["integer", "null"], "description": "Line number to start reading from (1-based) (minimum: 1)"}
    assert read["showLineNumbers"] == {"type": ["boolean", "null"], "description": "Prefix each line with its number (default: true)"}
    assert read["encoding"]["type"] == ["string", "null"]
    assert read["encoding"]["enum"] == ["utf-8", "utf8", "base64", "hex", "binary", None]
    assert params[FS.LIST_FILES]["properties"]["pattern"] == {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "description": "Glob(s) files must match, relative to the listed directory",
    }
    assert params[FS.LIST_FILES]["properties"]["path"]["description"].endswith('(default: ".")')


def test_nested_objects_and_arrays() -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"a": {"type": "string"}, "b": {"type": "integer", "default": 3}},
                    "required": ["a"],
                },
            },
            "mode": {"type": ["string", "null"], "enum": ["x", "y", None]},
        },
        "required": ["items"],
    }
    strict = strict_json_schema(schema)
    check_strict(strict)
    inner = strict["properties"]["items"]["items"]
    assert inner["required"] == ["a", "b"] and inner["properties"]["b"]["type"] == ["integer", "null"]
    assert strict["properties"]["items"]["description"] == "(minItems: 1)"
    assert strict["properties"]["mode"] == {"type": ["string", "null"], "enum": ["x", "y", None]}
    assert "additionalProperties" not in schema  # not changed in place


def strict_null_args(parameters: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """What a strict model sends: every property present, null for those it leaves out."""
    assert set(given) <= set(parameters["properties"])
    return {name: given.get(name) for name in parameters["required"]}


async def test_tools_take_the_nulls_a_strict_model_sends(tools: dict[str, WorkspaceTool], tmp_path: Path) -> None:
    params = {d["function"]["name"]: d["function"]["parameters"] for d in openai_tools(tools)}

    async def call(name: str, **given: Any) -> Any:
        args = strict_null_args(params[name], given)
        # Round trip through JSON, as the arguments arrive from the API.
        return await tools[name].execute(json.loads(json.dumps(args)))

    assert await call(FS.READ_FILE, path="a.txt") == "a.txt (24 bytes)\n     1→Hello World\n     2→second line\n     3→"
    assert await call(FS.READ_FILE, path="a.txt", offset=2) == "a.txt (lines 2-3 of 3, 24 bytes)\n     2→second line\n     3→"
    assert await call(FS.WRITE_FILE, path="b.txt", content="one\ntwo\n") == "Wrote 8 bytes to b.txt"
    assert await call(FS.WRITE_FILE, path="b.txt", content="one\ntwo\n") == "Wrote 8 bytes to b.txt"  # overwrite: null = true
    assert await call(FS.EDIT_FILE, path="b.txt", old_string="two", new_string="2") == "Replaced 1 occurrence in b.txt (lines 2)"
    assert (tmp_path / "b.txt").read_text() == "one\n2\n"
    assert await call(FS.MKDIR, path="d/e") == "Created directory d/e"  # recursive: null = true
    listing = await call(FS.LIST_FILES)
    assert listing == await tools[FS.LIST_FILES].execute({})
    assert "a.txt" in listing and "b.txt" in listing
    assert await call(FS.GREP, pattern="Hello") == await tools[FS.GREP].execute({"pattern": "Hello"})
    assert (await call(FS.FILE_STAT, path="a.txt")).startswith("a.txt Type: file Size: 24 bytes")
    assert await call(FS.DELETE, path="b.txt") == "Deleted b.txt"
    assert not (tmp_path / "b.txt").exists()
    # A required field is never null.
    with pytest.raises(ValueError, match="missing required field 'path'"):
        await call(FS.READ_FILE)


async def test_renamed_and_disabled_tools(tmp_path: Path) -> None:
    config = {FS.READ_FILE: {"name": "read"}, FS.DELETE: {"enabled": False}}
    tools = await Workspace(filesystem=LocalFilesystem(tmp_path), tools=config).create_tools()
    names = [d["function"]["name"] for d in openai_tools(tools)]
    assert names[0] == "read" and FS.DELETE not in names and len(names) == 7
