"""The adapters package: frameworks load only with their adapter, a missing one names its
extra, and every example of ``docs/integrations.md`` runs as a user pastes it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentvfs.errors import MissingExtraError
from agentvfs.integrations import require
from agentvfs.mounts import fuse_available

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"
#: Each adapter, the framework module it loads and the extra that installs it.
ADAPTERS = {
    "agentvfs.integrations.pydantic_ai": ("pydantic_ai", "pydantic-ai"),
    "agentvfs.integrations.deepagents": ("deepagents", "deepagents"),
    "agentvfs.integrations.openai_agents": ("agents", "openai-agents"),
    "agentvfs.integrations.claude": ("claude_agent_sdk", "claude"),
}


def _python(code: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_no_framework_loads_before_its_adapter() -> None:
    frameworks = sorted({module for module, _ in ADAPTERS.values()} | {"langchain_core", "langgraph", "mcp"})
    done = _python(
        "import sys, agentvfs, agentvfs.integrations, agentvfs.tools\n"
        f"print(sorted(m for m in {frameworks!r} if m in sys.modules))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_each_adapter_loads_its_framework() -> None:
    """One process imports every adapter in turn: each brings its own framework, and no
    other adapter's."""
    code = "import importlib, sys\n"
    for adapter, (framework, _) in sorted(ADAPTERS.items()):
        code += f"importlib.import_module({adapter!r}); print({adapter!r}, {framework!r} in sys.modules)\n"
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [word for adapter in sorted(ADAPTERS) for word in (adapter, "True")]


def test_a_missing_framework_names_the_extra() -> None:
    """With the frameworks hidden (a ``sys.modules`` entry of None makes an import fail),
    importing each adapter says which extra to install."""
    hidden = sorted({framework for framework, _ in ADAPTERS.values()})
    code = f"import importlib, sys\nfor name in {hidden!r}:\n    sys.modules[name] = None\n"
    code += "from agentvfs.errors import MissingExtraError\n"
    code += f"for adapter in {sorted(ADAPTERS)!r}:\n"
    code += "    try:\n        importlib.import_module(adapter)\n    except MissingExtraError as exc:\n"
    code += "        print(exc)\n    else:\n        print(adapter, 'imported')\n"
    done = _python(code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(ADAPTERS), lines
    for line, adapter in zip(lines, sorted(ADAPTERS), strict=True):
        assert line.startswith(adapter + ":"), line
        assert line.endswith(f"pip install 'agentvfs[{ADAPTERS[adapter][1]}]'"), line


def test_require_names_the_missing_module_and_extra() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("agentvfs_no_such_framework", "deepagents", "agentvfs.integrations.deepagents")
    assert isinstance(caught.value, ModuleNotFoundError)
    assert str(caught.value) == (
        "agentvfs.integrations.deepagents: the module 'agentvfs_no_such_framework' is not "
        "installed; pip install 'agentvfs[deepagents]'"
    )
    assert require("json", "x", "y").__name__ == "json"


def doc_blocks() -> list[tuple[str, str]]:
    """The Python blocks of docs/integrations.md with the section each belongs to."""
    found = []
    section = ""
    for match in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.M | re.S):
        if match.group(1):
            section = match.group(1).strip()
        else:
            found.append((section, match.group(2)))
    return found


def test_the_page_has_an_example_per_framework() -> None:
    sections = {section for section, _ in doc_blocks()}
    assert len(sections) >= len(ADAPTERS), sections


@pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")
@pytest.mark.parametrize("index", range(len(doc_blocks())), ids=lambda i: re.sub(r"\W+", "-", doc_blocks()[i][0]).strip("-").lower())
def test_each_example_runs_as_pasted(index: int, tmp_path: Path) -> None:
    """Each block is a whole script: run as it stands, in a fresh directory, offline."""
    section, code = doc_blocks()[index]
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "ANTHROPIC"))}
    done = subprocess.run(
        [sys.executable, os.fspath(script)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{section}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{section} printed nothing"
